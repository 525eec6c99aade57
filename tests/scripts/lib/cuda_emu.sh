# Sourced by tests/scripts/cuda_emu.sh and cuda_emu_device.sh: the .cu files of src/cuda turned
# into host C++ (tests/tools/cuda_emu/transform.py) and compiled against cuda_emu.h.
#   emu_flags LIB          sets emu_cxx (the C++ flags; ASan's when LIB was built with it)
#   emu_objects DIR        transforms and compiles every src/cuda/*.cu into DIR; sets objs
#   emu_library            sets E: the library under test when it has no CUDA layer of its own
#                          (make test-asan's build-san), else a CPU-only build of it (build-emu)
#   emu_device BUILD DIR   the emulated device over BUILD's CPU-only library: the kernels, src/cuda's
#                          C files, the nccl backend and the emulated runtime and NCCL, into DIR;
#                          sets objs, cflags (C files against the emulated runtime), defs and libs
emu_flags() {
    emu_cxx=(-std=c++17 -O1 -g -Wall -Wextra -Werror -Wno-unknown-pragmas -Wno-unused-parameter -DCT_HAVE_CUDA=1
             -Itests/tools/cuda_emu/include -Itests/tools/cuda_emu -Iinclude -Isrc)
    # a sanitizer build of the library (make test-asan) takes the same instrumentation here
    if nm "$1" 2>/dev/null | grep ' U __asan_' >/dev/null; then
        emu_cxx+=(-fsanitize=address,undefined -fno-omit-frame-pointer)
    fi
}
emu_objects() {
    local d=$1 h f n
    mkdir -p "$d/cuda"
    for h in src/cuda/*.cuh; do python3 tests/tools/cuda_emu/transform.py "$h" "$d/cuda/$(basename "$h")" || return 1; done
    objs=()
    for f in src/cuda/*.cu; do
        n=$(basename "$f" .cu)
        python3 tests/tools/cuda_emu/transform.py "$f" "$d/$n.cc" || return 1
        g++ "${emu_cxx[@]}" -I"$d" -c "$d/$n.cc" -o "$d/$n.o" || { echo "cannot compile $f for the emulation"; return 1; }
        objs+=("$d/$n.o")
    done
}
emu_libs() { pkg-config --libs openblas libcjson zlib 2>/dev/null || echo -lopenblas -lcjson -lz; }
emu_device() {
    local E=$1 tmp=$2 f san=() sanf=()
    [ "$E" = build-san ] && san=(SAN=1)
    read -r -a libs <<<"$(make -s --no-print-directory BUILD="$E" CUDA=0 "${san[@]}" print-ldlibs)"
    emu_flags "$E/libctrain.a"
    emu_objects "$tmp" || return 1
    [[ " ${emu_cxx[*]} " == *" -fsanitize="* ]] && sanf=(-fsanitize=address,undefined -fno-omit-frame-pointer)
    cflags=(-std=c11 -D_GNU_SOURCE -O1 -g -Wall -Wextra -Werror -fopenmp -DCT_HAVE_CUDA=1 -Itests/tools/cuda_emu/crt -Iinclude -Isrc
            -Itests "${sanf[@]}")
    for f in alloc device ops ops_more ops_llama ops_attention; do
        gcc "${cflags[@]}" -c "src/cuda/$f.c" -o "$tmp/c_$f.o" || { echo "cannot compile src/cuda/$f.c for the emulated device"; return 1; }
        objs+=("$tmp/c_$f.o")
    done
    # the nccl backend, and the backend table rebuilt to list it (linked ahead of the library's)
    read -r -a defs <<<"$(make -s --no-print-directory BUILD="$E" CUDA=0 "${san[@]}" print-defs)"
    for f in nccl backends; do
        gcc "${cflags[@]}" "${defs[@]}" -c "src/distributed/$f.c" -o "$tmp/d_$f.o" ||
            { echo "cannot compile src/distributed/$f.c for the emulated device"; return 1; }
        objs+=("$tmp/d_$f.o")
    done
    g++ -Itests/tools/cuda_emu/crt "${emu_cxx[@]}" -c tests/tools/cuda_emu/emu_nccl.cc -o "$tmp/emu_nccl.o" || return 1
    objs+=("$tmp/emu_nccl.o")
    g++ "${emu_cxx[@]}" -c tests/tools/cuda_emu/emu_runtime.cc -o "$tmp/emu_runtime.o" || return 1
    # the runtime API's C side first: emu_device.cc defines it
    g++ -Itests/tools/cuda_emu/crt "${emu_cxx[@]}" -c tests/tools/cuda_emu/emu_device.cc -o "$tmp/emu_device.o" || return 1
    objs+=("$tmp/emu_runtime.o" "$tmp/emu_device.o")
}
emu_library() {
    local B=${CT_BUILD:-build} syms
    E=$B
    syms=$(nm "$B/libctrain.a" 2>/dev/null)
    if [ ! -f "$B/libctrain.a" ] || grep -q ' T ct_cuda_register$' <<<"$syms"; then
        E=build-emu
        make -s BUILD="$E" CUDA=0 "$E/libctrain.a" >/dev/null || { echo "cannot build the CPU-only library in $E"; return 1; }
    fi
}
