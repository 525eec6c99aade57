# A small Llama and its tokenizer, made from a config and local text (nothing downloaded).
import sys, torch
from tokenizers import Tokenizer, models, trainers, pre_tokenizers, decoders
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

text, out = sys.argv[1], sys.argv[2]
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.train([text], trainers.BpeTrainer(vocab_size=1024, special_tokens=["<|endoftext|>"],
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>")
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=fast.vocab_size, hidden_size=128, intermediate_size=256,
                  num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=256, tie_word_embeddings=True,
                  bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id)
LlamaForCausalLM(cfg).save_pretrained(out)
fast.save_pretrained(out)
print("saved", out, "vocab", fast.vocab_size)
