"""One TCP stream's rate, for bench/shaped_links.sh (the machine has no iperf):

    python3 bench/bulk_rate.py recv ADDR PORT        # prints gbit_s=X after the sender is done
    python3 bench/bulk_rate.py send ADDR PORT SECONDS

The receiver times from the first byte to the last, so a shaped link's rate is what arrives."""
import socket
import sys
import time


def main():
    mode, addr, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if mode == "recv":
        srv = socket.socket()
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind((addr, port))
        srv.listen(1)
        srv.settimeout(30)
        conn, _ = srv.accept()
        buf = bytearray(1 << 20)
        n, t0 = 0, None
        while True:
            k = conn.recv_into(buf)
            if not k:
                break
            if t0 is None:
                t0 = time.perf_counter()
            n += k
        dt = time.perf_counter() - t0
        print(f"gbit_s={8 * n / dt / 1e9:.3f} bytes={n} seconds={dt:.2f}")
    else:
        seconds = float(sys.argv[4])
        s = socket.create_connection((addr, port), timeout=30)
        chunk = b"\0" * (1 << 20)
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            s.sendall(chunk)
        s.close()


if __name__ == "__main__":
    main()
