#!/usr/bin/env bash
# The layers only point down (DESIGN.md §3): core <- ops <- nn <- models;
# core <- distributed <- ddp <- train <- cli; io, data and optim rest on core alone;
# cuda (kernels, allocator) rests on core and ops' per-element math, under distributed; cli
# reaches the GPUs through core's public device calls only.
# Checked three ways: the public headers each file includes, the private headers (a
# module's src/<module>/*.h are its own), and the symbols each module's objects call (nm).
# Also: only the configuration table reads or sets the environment.
set -uo pipefail
cd "$(dirname "$0")/../.."
declare -A allow=(
    [core]="core" [ops]="core ops" [nn]="core ops nn" [models]="core ops nn io models"
    [optim]="core optim" [io]="core io" [data]="core data" [distributed]="core distributed cuda"
    [ddp]="core distributed ddp" [train]="core ops nn models optim io data distributed ddp text train"
    [cli]="core ops nn models optim io data distributed ddp text train cli"
    [cuda]="core ops cuda" [text]="core text")
declare -A header=(
    [core.h]=core [tensor.h]=core [autograd.h]=core [config.h]=core [ops.h]=ops [nn.h]=nn [models.h]=models
    [optim.h]=optim [io.h]=io [metrics.h]=io [data.h]=data [loader.h]=data [dist.h]=distributed
    [launch.h]=distributed [ddp.h]=ddp [train.h]=train [fsdp.h]=train [text.h]=text [ctrain.h]=cli)
# the interface core gives its kernels: the op table, tape recording, the arena, the RNG
kernel_api="core/kernel.h core/rng.h"
# the CUDA layer (src/cuda, built with CUDA only) under the NCCL backend
cuda_api="cuda/cuda.h cuda/check.h"
mod_of_path() { # src/<module>/... or include/ctrain/<header>
    case "$1" in
    src/*) local m=${1#src/}; echo "${m%%/*}" ;;
    include/ctrain/*) echo "${header[$(basename "$1")]:-?}" ;;
    esac
}
bad=0
say() { echo "$*"; bad=1; }
for f in $(find src include -name '*.[ch]' | sort); do
    m=$(mod_of_path "$f")
    [ "$m" = "?" ] && { say "$f: a public header the layering check does not know"; continue; }
    while read -r inc; do
        case "$inc" in
        ctrain/*)
            h=${inc#ctrain/}; hm=${header[$h]:-?}
            [ "$hm" = "?" ] && { say "$f includes unknown public header $inc"; continue; }
            [[ " ${allow[$m]} " == *" $hm "* ]] || say "$f ($m) includes $inc ($hm): points up" ;;
        */*)
            im=${inc%%/*}
            [ "$im" = "$m" ] && continue
            # ...and the optimizers (its device hooks: the fused pass on a GPU)
            [[ "$m" = ops || "$m" = optim ]] && [[ " $kernel_api " == *" $inc "* ]] && continue
            # the CUDA kernels and the optimizers share the CPU ops' per-element math (a
            # header of inline functions); cuda's C interface is its two headers, for the
            # modules allowed to use it
            [[ "$m" = cuda || "$m" = optim ]] && [ "$inc" = ops/kmath.h ] && continue
            # the CUDA backend fills core's device hooks and the op table's device column
            [ "$m" = cuda ] && [[ " $kernel_api ops/op_table.h " == *" $inc "* ]] && continue
            [[ " $cuda_api " == *" $inc "* && " ${allow[$m]} " == *" cuda "* ]] && continue
            say "$f ($m) includes $inc, private to src/$im" ;;
        esac
    done < <(sed -n 's/^#include "\(.*\)".*/\1/p' "$f")
done
# calls: every ct_ symbol a module's objects use must be defined in a module it may use
objs() { # the objects of module $1's current sources (stale objects of moved files ignored)
    for c in $(find "src/$1" -name '*.c'); do o="${CT_BUILD:-build}/obj/${c%.c}.o"; [ -f "$o" ] && echo "$o"; done
}
if [ -d ${CT_BUILD:-build}/obj/src ]; then
    declare -A def
    while read -r m sym; do def[$sym]=$m; done < <(for m in "${!allow[@]}"; do
        o=$(objs "$m"); [ -n "$o" ] && nm --defined-only -g $o 2>/dev/null | awk -v m="$m" 'NF == 3 && $3 ~ /^ct_/ { print m, $3 }'; done)
    for m in "${!allow[@]}"; do
        o=$(objs "$m"); [ -n "$o" ] || continue
        for sym in $(nm -u $o 2>/dev/null | awk '$2 ~ /^ct_/ { print $2 }' | sort -u); do
            dm=${def[$sym]:-}
            [ -z "$dm" ] && continue
            [[ " ${allow[$m]} " == *" $dm "* ]] || say "src/$m calls $sym of src/$dm: points up"
        done
    done
else
    say "${CT_BUILD:-build}/obj/src missing: build first"
fi
env_users=$(grep -rln 'getenv\|setenv\|unsetenv\|environ\b' src | grep -v '^src/core/config.c$')
[ -z "$env_users" ] || say "environment read or set outside src/core/config.c: $(echo $env_users)"
# a model kind is its own file plus one table row (docs/adding-a-model.md): outside src/models
# nothing names a kind or reaches into a kind's part of the config
kind_users=$(grep -rlnE 'CT_MODEL_(MLP|CNN|GPT|LLAMA)\b|(\.|->)(mlp|cnn|gpt|llama)\.' src --include='*.c' --include='*.h' --include='*.cu' | grep -v '^src/models/')
[ -z "$kind_users" ] || say "a model kind named outside src/models: $(echo $kind_users)"
# nn's module.c is plumbing: every module type describes itself (ct_module_ops), so
# module.c names no type (as a string: no strcmp chain, no repr of its own), calls nothing
# of the quantized Linear's, and includes no other nn file's private header
mod_c=src/nn/module.c
mod_types=$(sed -n 's/.*ct_module_ops [A-Za-z0-9_]* = {\(\.type = \)\{0,1\}"\([A-Za-z0-9]*\)".*/\2/p' src/nn/*.c src/models/*.c | sort -u)
[ -n "$mod_types" ] || say "no ct_module_ops definitions found in src/nn, src/models: the module.c check reads none"
for t in $mod_types; do
    grep -q "\"$t" "$mod_c" && say "$mod_c names the module type $t (its own ops should say it)"
done
grep -q 'ct_qlinear_\|ct_qweight_' "$mod_c" && say "$mod_c reaches into the quantized Linear (src/nn/quantized.c)"
grep -q '^#include "nn/' "$mod_c" && say "$mod_c includes a private nn header"
# backends by name only in src/distributed (its table, backends.c): elsewhere code asks the
# group what it can do (ct_pg_caps, ct_dist_backend_find) instead of comparing names
be_names=$(grep -rnE 'str(n|case|ncase)?cmp *\([^;]*"(nccl|shm|mpi|gloo|hier)"' src --include='*.c' --include='*.h' \
               --include='*.cc' --include='*.cu' | grep -v '^src/distributed/')
[ -z "$be_names" ] || say "backend names compared outside src/distributed (use ct_pg_caps): $be_names"
[ $bad -eq 0 ] && echo "layers point down; the environment is read in one place"
exit $bad
