# Sourced by tests/scripts/cuda_emu.sh and cuda_emu_device.sh: the .cu files of src/cuda turned
# into host C++ (tests/tools/cuda_emu/transform.py) and compiled against cuda_emu.h.
#   emu_flags LIB          sets emu_cxx (the C++ flags; ASan's when LIB was built with it)
#   emu_objects DIR        transforms and compiles every src/cuda/*.cu into DIR; sets objs
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
