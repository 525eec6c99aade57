#!/usr/bin/env bash
# The library as a dependency: `make install PREFIX=...` installs headers, libraries, the
# command and ctrain.pc; <ctrain/ctrain.h> includes every installed header; every
# examples/*.c, copied out of the tree, builds against the installed copy with nothing but
# `pkg-config --cflags --libs ctrain`, and examples/custom_model trains a few steps on 2
# ranks under the installed `ctrain run`.
set -euo pipefail
cd "$(dirname "$0")/../.."
src=$PWD
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
p=$d/p
make install PREFIX="$p" > /dev/null
test -x "$p/bin/ctrain" && test -f "$p/include/ctrain/ctrain.h" && test -f "$p/lib/libctrain.a" \
    && test -f "$p/lib/libctrain.so" && test -f "$p/lib/pkgconfig/ctrain.pc"

# every public header is installed and reached from ctrain.h
inc=$p/include/ctrain
for h in "$src"/include/ctrain/*.h; do
    test -f "$inc/$(basename "$h")" || { echo "$(basename "$h") not installed"; exit 1; }
done
missing=()
for h in "$inc"/*.h; do
    b=$(basename "$h")
    [ "$b" = ctrain.h ] && continue
    grep -Eq "^#include [<\"]ctrain/$b[>\"]" "$inc/ctrain.h" || missing+=("$b")
done
[ ${#missing[@]} -eq 0 ] || { echo "ctrain.h does not include: ${missing[*]}"; exit 1; }

export PKG_CONFIG_PATH="$p/lib/pkgconfig"
cflags=$(pkg-config --cflags ctrain); libs=$(pkg-config --libs ctrain)
# Nothing may come from the source tree, and the headers found must be the installed ones
# (not an older copy in /usr/local/include, say).
case " $cflags $libs " in *"$src"*) echo "pkg-config points into the source tree: $cflags $libs"; exit 1;; esac
W=(-std=c11 -Wall -Wextra -Werror)

# each header compiles on its own, in a program that includes nothing else
for h in "$inc"/*.h; do
    printf '#include <ctrain/%s>\nint main(void) { return 0; }\n' "$(basename "$h")" > "$d/h.c"
    gcc "${W[@]}" -fsyntax-only $cflags "$d/h.c" || { echo "ctrain/$(basename "$h") does not compile alone"; exit 1; }
done

mkdir -p "$d/ex" "$d/bin"
cp examples/*.c "$d/ex/"
cat > "$d/ex/u.c" <<'C'
#include <ctrain/ctrain.h>
#include <stdio.h>
int main(void) {
    ct_ctx *c; ct_ctx_create(NULL, &c);
    ct_tensor *t = ct_zeros(c, CT_F32, 2, (int64_t[]){3, 4});
    printf("%lld\n", (long long)ct_numel(t));
    ct_ctx_free(c);
    return 0;
}
C
n=0
(
    cd "$d/ex"
    for f in *.c; do
        gcc "${W[@]}" -O2 $cflags "$f" -o "../bin/${f%.c}" $libs || { echo "examples/$f does not build against the installed copy"; exit 1; }
        # the ctrain headers it saw are the installed ones
        gcc "${W[@]}" -M $cflags "$f" | tr ' \\' '\n\n' | grep '/ctrain/' | grep -v "^$inc/" \
            && { echo "examples/$f included ctrain headers from outside $inc"; exit 1; }
        true
    done
)
for f in examples/*.c; do test -x "$d/bin/$(basename "${f%.c}")"; n=$((n + 1)); done
export LD_LIBRARY_PATH="$p/lib"
[ "$("$d/bin/u")" = 12 ]
"$p/bin/ctrain" --version | grep -q "ctrain "
# the programs use the installed shared library
# (grep reads all of ldd's output: with -q it may stop early, and pipefail then sees ldd's SIGPIPE)
ldd "$d/bin/custom_model" | grep "libctrain.so => $p/lib/libctrain.so" >/dev/null || { ldd "$d/bin/custom_model"; exit 1; }

. tests/tools/fashion_mnist.sh
cd "$d"
"$p/bin/ctrain" run --standalone --nproc-per-node 2 "$d/bin/custom_model" "$d/out" 6 > run.log 2>&1 \
    || { cat run.log; echo "installed custom_model failed under the installed ctrain run"; exit 1; }
grep -q "^resmlp | 2 ranks" run.log && grep -q "^done: 6 steps" run.log && test -s out/model.safetensors \
    || { cat run.log; echo "custom_model: not a 6-step 2-rank run"; exit 1; }
echo "installed to a prefix: $n examples built with pkg-config only; custom_model trained 6 steps on 2 ranks"
