# Golden fixtures for more architectures and checkpoint forms, made like ../shared/reference/
# make_fixtures.py (random seeded weights, fp32 eager attention, CPU math, transformers 5.17).
# Run on the GPU machine (it has torch + transformers): OUT=... python3 make_model_fixtures.py
# Writes $OUT/model_fixtures_more.tar.gz with one folder per model: config.json, safetensors
# (single file or sharded), golden.safetensors (seq_a/seq_b logits, greedy continuation, full
# logits) and golden.json.
#   tiny-qwen3         q/k RMSNorm, explicit head_dim 32 (!= hidden/heads), one KV head, tied embeddings
#   tiny-mistral       MistralForCausalLM, no sliding window, sharded checkpoint (index.json)
#   tiny-llama-biased  linear RoPE scaling, attention_bias (q/k/v/o biases) and mlp_bias
#   tiny-qwen2-bf16    Qwen2 stored in bf16; the reference runs the bf16-rounded weights in fp32
import os, json, shutil, tarfile, torch, transformers
from safetensors.torch import save_file
torch.manual_seed(2024); torch.set_num_threads(8)
OUT = os.environ.get("OUT", "."); root = "/tmp/fixtures3"; shutil.rmtree(root, ignore_errors=True); os.makedirs(root)
COMMON = dict(vocab_size=384, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5, attn_implementation="eager",
              bos_token_id=1, eos_token_id=2, pad_token_id=0)

def randomize(m):
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "norm" in n: p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif "bias" in n: p.copy_(0.05 * torch.randn_like(p))
            else: p.copy_(torch.randn_like(p) * (0.5 / p.shape[-1] ** 0.5))

def golden(name, cfg, M, save_dtype=torch.float32, shard=None):
    m = M(cfg).float().eval(); randomize(m); d = os.path.join(root, name); os.makedirs(d)
    if save_dtype != torch.float32:
        # Round the weights through the stored dtype, then run them in a fresh fp32 model: m.to(bf16)
        # would also round the rotary inv_freq buffer, which a model loaded for fp32 use recomputes.
        m.to(save_dtype).save_pretrained(d, safe_serialization=True)
        rounded = {k: v.to(save_dtype).float() for k, v in m.state_dict().items()}
        m = M(cfg).float().eval(); m.load_state_dict(rounded)
    elif shard:
        m.save_pretrained(d, safe_serialization=True, max_shard_size=shard)
    else:
        m.save_pretrained(d, safe_serialization=True)
    gen_cfg = os.path.join(d, "generation_config.json")
    if os.path.exists(gen_cfg): os.remove(gen_cfg)
    g = {}
    a = torch.randint(3, cfg.vocab_size, (1, 23)); b = torch.randint(3, cfg.vocab_size, (1, 9))
    with torch.no_grad():
        g["seq_a.input_ids"] = a[0].int(); g["seq_a.logits"] = m(a).logits[0].float()
        g["seq_b.input_ids"] = b[0].int(); g["seq_b.logits"] = m(b).logits[0].float()
        out = m.generate(b, max_new_tokens=16, min_new_tokens=16, do_sample=False, eos_token_id=None, pad_token_id=0)
        g["greedy.new_tokens"] = out[0, b.shape[1]:].int(); g["greedy.full_logits"] = m(out).logits[0].float()
    save_file({k: v.contiguous() for k, v in g.items()}, os.path.join(d, "golden.safetensors"))
    json.dump({"model": name, "transformers": transformers.__version__, "torch": torch.__version__,
               "stored_dtype": str(save_dtype), "sharded": bool(shard)}, open(os.path.join(d, "golden.json"), "w"), indent=1)
    print(name, "ok", sorted(os.listdir(d)), flush=True)

from transformers import Qwen3Config, Qwen3ForCausalLM, MistralConfig, MistralForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
c = dict(COMMON); c["num_key_value_heads"] = 1
golden("tiny-qwen3", Qwen3Config(**c, head_dim=32, rope_theta=1000000.0, tie_word_embeddings=True), Qwen3ForCausalLM)
golden("tiny-mistral", MistralConfig(**COMMON, sliding_window=None, rope_theta=10000.0, tie_word_embeddings=False),
       MistralForCausalLM, shard="40KB")
golden("tiny-llama-biased", LlamaConfig(**COMMON, attention_bias=True, mlp_bias=True, tie_word_embeddings=False,
       rope_scaling={"rope_type": "linear", "factor": 2.0}, rope_theta=10000.0), LlamaForCausalLM)
golden("tiny-qwen2-bf16", Qwen2Config(**COMMON, rope_theta=1000000.0, tie_word_embeddings=True), Qwen2ForCausalLM,
       save_dtype=torch.bfloat16)
with tarfile.open(os.path.join(OUT, "model_fixtures_more.tar.gz"), "w:gz") as tf: tf.add(root, arcname="fixtures")
print("wrote", os.path.join(OUT, "model_fixtures_more.tar.gz"))
