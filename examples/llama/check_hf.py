# Loads ctrain's export in transformers and generates greedily from a prompt.
import sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
d, prompt = sys.argv[1], sys.argv[2]
tok = AutoTokenizer.from_pretrained(d)
model = AutoModelForCausalLM.from_pretrained(d)
ids = tok(prompt, return_tensors="pt").input_ids
out = model.generate(ids, max_new_tokens=30, do_sample=False)
print(tok.decode(out[0]))
