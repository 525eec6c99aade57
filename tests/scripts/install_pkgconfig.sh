#!/usr/bin/env bash
# `make install PREFIX=...` installs headers, libraries, the command and ctrain.pc, and a
# program built only from pkg-config's flags links and runs against it.
set -euo pipefail
cd "$(dirname "$0")/../.."
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
make install PREFIX="$d/p" > /dev/null
test -x "$d/p/bin/ctrain" && test -f "$d/p/include/ctrain/ctrain.h" && test -f "$d/p/lib/libctrain.a"
cat > "$d/u.c" <<'C'
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
export PKG_CONFIG_PATH="$d/p/lib/pkgconfig"
gcc -std=c11 "$d/u.c" $(pkg-config --cflags ctrain) -o "$d/u" $(pkg-config --libs ctrain)
[ "$(LD_LIBRARY_PATH="$d/p/lib" "$d/u")" = 12 ]
"$d/p/bin/ctrain" --version | grep -q "ctrain "
echo ok
