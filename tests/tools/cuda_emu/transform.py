"""Rewrites a .cu file for the CPU emulation (cuda_emu.h): every kernel launch
`name<T...><<<grid, block[, smem[, stream]]>>>(args)` becomes
`ct_emu_launch(dim3(grid), dim3(block), smem, [&] { name<T...>(args); })`, and
`extern __shared__ T name[];` a pointer to the emulated dynamic shared memory.

    python3 transform.py IN.cu OUT.cc
"""
import re
import sys


def split_top(s):
    """s split at commas outside brackets"""
    out, depth, cur = [], 0, ""
    for ch in s:
        if ch in "([{<":
            depth += 1
        elif ch in ")]}>":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    out.append(cur.strip())
    return out


def match(src, i, opening, closing, step):
    """the index of the bracket that closes the one at src[i], walking by step (+1 or -1)"""
    depth = 0
    while True:
        if src[i] == opening:
            depth += 1
        elif src[i] == closing:
            depth -= 1
            if depth == 0:
                return i
        i += step


def transform(src):
    src = re.sub(r"extern\s+__shared__\s+(\w+)\s+(\w+)\s*\[\s*\]\s*;", r"\1 *\2 = (\1 *)ct_emu_dyn_smem;", src)
    while True:
        i = src.find("<<<")
        if i < 0:
            return src
        # the kernel's name, with its template arguments
        j = i
        while src[j - 1].isspace():
            j -= 1
        if src[j - 1] == ">":
            j = match(src, j - 1, ">", "<", -1)
        while src[j - 1].isalnum() or src[j - 1] in "_:":
            j -= 1
        name = src[j:i].strip()
        k = src.index(">>>", i)
        cfg = split_top(src[i + 3:k])
        p = src.index("(", k)
        q = match(src, p, "(", ")", 1)
        args = src[p + 1:q]
        smem = cfg[2] if len(cfg) > 2 else "0"
        call = "ct_emu_launch(dim3(%s), dim3(%s), (size_t)(%s), [&] { %s(%s); })" % (cfg[0], cfg[1], smem, name, args)
        src = src[:j] + call + src[q + 1:]


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        text = f.read()
    with open(sys.argv[2], "w") as f:
        f.write('#include "cuda_emu.h"\n#line 1 "%s"\n' % sys.argv[1] + transform(text))
