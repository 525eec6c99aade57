"""ctrain's Llama export loads in transformers and gives the reference's logits (run by hand:
CI has no transformers; the result is in docs/llama.md).

    mkdir -p /tmp/llama_export
    CT_LLAMA_EXPORT_DIR=/tmp/llama_export build/tests/test_llama_transformers export_reopens_with_same_logits
    /work/main/build/venv-bench/bin/python tests/torch/check_llama_export.py /tmp/llama_export

For each fixture NAME (tests/fixtures/models/llama_tf_NAME): LlamaForCausalLM.from_pretrained
of the export, its logits for ref.safetensors' input_ids against the reference's (normwise
error), the head tied as the config says, and 50 greedy tokens as the reference's.
"""
import os
import sys

import torch
import transformers
from transformers import LlamaForCausalLM

sys.path.insert(0, os.path.dirname(__file__))
import st  # noqa: E402

FIX = os.path.join(os.path.dirname(__file__), "..", "fixtures", "models")


def main(root):
    worst = 0.0
    for name in ("gqa", "llama3", "sharded"):
        r = st.load(os.path.join(FIX, "llama_tf_" + name, "ref.safetensors"))
        m = LlamaForCausalLM.from_pretrained(os.path.join(root, name), dtype=torch.float32).eval()
        with torch.no_grad():
            logits = m(input_ids=r["input_ids"]).logits.float()
            gen = m.generate(r["prompt"][None], max_new_tokens=50, min_new_tokens=50, do_sample=False, pad_token_id=0)
        err = ((logits - r["logits"]).norm() / r["logits"].norm()).item()
        tied = m.lm_head.weight.data_ptr() == m.model.embed_tokens.weight.data_ptr()
        same = bool((gen[0, r["prompt"].numel():] == r["greedy"]).all())
        print(f"{name}: transformers {transformers.__version__} from_pretrained of the export: logits normwise error {err:.3g}, "
              f"head tied {tied} (config {m.config.tie_word_embeddings}), rope {m.config.rope_parameters.get('rope_type')}, "
              f"greedy 50 tokens equal {same}")
        worst = max(worst, err)
        assert err <= 1e-5 and same and tied == m.config.tie_word_embeddings
    print(f"worst normwise error {worst:.3g}")


if __name__ == "__main__":
    main(sys.argv[1])
