# Makes testdata/eval/reference.json: what kiln eval's perplexity and choice tasks must report,
# computed with transformers (fp32, CPU) on the files in testdata/eval/ for two model folders:
#   tiny-chat        (llama weights with a byte-level BPE tokenizer and a ChatML template)
#   tiny-qwen2-chat  tiny-qwen2's config.json and model.safetensors with tiny-chat's text files
#                    (the test composes the same folder).
# Choice questions follow lm-evaluation-harness's loglikelihood requests: trailing whitespace of the
# context moves to the continuation; continuation tokens are those of context + choice after the
# context's own tokens; an empty context is the EOS token; a chat context is apply_chat_template
# with the generation prompt, tokenized without special tokens. acc = argmax of the sums, acc_norm =
# argmax of the sums over the choices' lengths in characters (first index on ties).
# Perplexity follows transformers' sliding-window recipe (context L, stride S): window [begin, end)
# scores its new tokens [previous end, end).
# Run (transformers 5.17, torch): python3 tests/reference/make_eval_reference.py [OUT.json]
import json, math, os, shutil, sys, tempfile

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "..", "testdata")
EVAL = os.path.join(DATA, "eval")
TEXT_FILES = ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"]
WINDOWS = [(256, 256), (32, 16), (24, 24)]  # (context, stride)


def compose_qwen2(tmp):
    d = os.path.join(tmp, "tiny-qwen2-chat")
    os.makedirs(d)
    for f in ["config.json", "model.safetensors"]:
        shutil.copy(os.path.join(DATA, "tiny-qwen2", f), d)
    for f in TEXT_FILES:
        shutil.copy(os.path.join(DATA, "tiny-chat", f), d)
    return d


def token_logprobs(model, ids):
    """log p(ids[t] | ids[<t]) for t = 1 .. len(ids) - 1, from fp32 logits in float64."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].double()
    lp = torch.log_softmax(logits, dim=-1)
    return [lp[t - 1, ids[t]].item() for t in range(1, len(ids))]


def choice_reference(model, tok):
    out = []
    for line in open(os.path.join(EVAL, "choice.jsonl"), encoding="utf-8"):
        q = json.loads(line)
        chat = "messages" in q
        context = tok.apply_chat_template(q["messages"], add_generation_prompt=True, tokenize=False) if chat else q["context"]
        special = not chat
        n = len(context) - len(context.rstrip())
        moved, context = (context[-n:], context[:-n]) if n else ("", context)
        lls = []
        for choice in q["choices"]:
            cont = moved + choice
            if context == "":
                ctx_ids = [tok.eos_token_id]
                cont_ids = tok(cont, add_special_tokens=False).input_ids
            else:
                whole = tok(context + cont, add_special_tokens=special).input_ids
                ctx_ids = tok(context, add_special_tokens=special).input_ids
                cont_ids = whole[len(ctx_ids):]
            lp = token_logprobs(model, ctx_ids + cont_ids)
            lls.append(sum(lp[len(ctx_ids) - 1:]))
        norm = [ll / len(c) for ll, c in zip(lls, q["choices"])]
        pred = max(range(len(lls)), key=lambda i: (lls[i], -i))
        pred_norm = max(range(len(norm)), key=lambda i: (norm[i], -i))
        out.append({"loglikelihoods": lls, "prediction": pred, "prediction_norm": pred_norm, "answer": q["answer"]})
    n = len(out)
    return {"questions": out,
            "acc": sum(o["prediction"] == o["answer"] for o in out) / n,
            "acc_norm": sum(o["prediction_norm"] == o["answer"] for o in out) / n}


def perplexity_reference(model, tok, L, S):
    docs, nll, tokens, nbytes = [], 0.0, 0, 0
    for line in open(os.path.join(EVAL, "perplexity.jsonl"), encoding="utf-8"):
        text = json.loads(line)["text"]
        ids = tok(text).input_ids
        if len(ids) < 2:
            docs.append(None)  # nothing to predict: skipped
            continue
        doc_nll, doc_tokens, prev_end = 0.0, 0, 0
        for begin in range(0, len(ids), S):
            end = min(begin + L, len(ids))
            window = ids[begin:end]
            lp = token_logprobs(model, window)
            first = max(1, prev_end - begin)  # window index of the first new token
            doc_nll -= sum(lp[first - 1:])
            doc_tokens += len(window) - first
            prev_end = end
            if end == len(ids):
                break
        docs.append({"tokens": doc_tokens, "nll": doc_nll})
        nll += doc_nll
        tokens += doc_tokens
        nbytes += len(text.encode("utf-8"))
    return {"context": L, "stride": S, "documents": docs, "nll": nll, "tokens": tokens,
            "perplexity": math.exp(nll / tokens), "bits_per_byte": nll / math.log(2) / nbytes}


def main():
    out_path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(EVAL, "reference.json")
    result = {"transformers": transformers.__version__, "torch": torch.__version__, "models": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name, d in [("tiny-chat", os.path.join(DATA, "tiny-chat")), ("tiny-qwen2-chat", compose_qwen2(tmp))]:
            model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
            tok = AutoTokenizer.from_pretrained(d)
            result["models"][name] = {
                "choice": choice_reference(model, tok),
                "perplexity": [perplexity_reference(model, tok, L, S) for L, S in WINDOWS],
            }
    with open(out_path, "w") as f:
        json.dump(result, f, indent=1)
    print("wrote", out_path)


if __name__ == "__main__":
    main()
