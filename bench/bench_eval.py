# kiln eval --task choice throughput beside the same computation in transformers, on one GPU.
# Builds a model folder of the given config (random weights) with tiny-chat's tokenizer, writes
# --questions synthetic questions (a context of 40..120 words and four choices of 1..6 words, fixed
# seed), runs `kiln eval --task choice --random-weights --device cuda` on them, then transformers
# (bf16, sdpa) on the same token sequences: the choices of --hf-batch questions padded into one
# forward, each continuation's log-likelihood summed. Both timings include tokenization; kiln's
# excludes loading the model (transformers' likewise). Prints one JSON object.
# Usage: python3 bench/bench_eval.py --kiln build-gpu/bin/kiln [--config bench/configs/llama-1b-shape.config.json]
import argparse, json, os, random, shutil, subprocess, sys, tempfile, time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
WORDS = ("the a cat dog bird fish red blue green small big runs sits jumps sings swims on in under over "
         "tree house river hill what is colour of sky grass sea hello hi thanks please yes no").split()


def make_questions(path, n, seed):
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(n):
            context = " ".join(rng.choice(WORDS) for _ in range(rng.randint(40, 120)))
            choices = [" " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6))) for _ in range(4)]
            f.write(json.dumps({"context": context, "choices": choices, "answer": rng.randrange(4)}) + "\n")


def hf_choice(model_dir, data, batch):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    config = AutoConfig.from_pretrained(model_dir)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, attn_implementation="sdpa").cuda().eval()
    tok = AutoTokenizer.from_pretrained(model_dir)
    lines = [json.loads(l) for l in open(data)]

    def run(lines):
        correct = 0
        for b in range(0, len(lines), batch):
            seqs, spans, owners = [], [], []
            for qi, q in enumerate(lines[b:b + batch]):
                ctx = tok(q["context"]).input_ids
                for c in q["choices"]:
                    whole = tok(q["context"] + c).input_ids
                    seqs.append(ctx + whole[len(ctx):])
                    spans.append((len(ctx), len(seqs[-1])))
                    owners.append(qi)
            width = max(len(s) for s in seqs)
            ids = torch.zeros(len(seqs), width, dtype=torch.long)
            mask = torch.zeros(len(seqs), width, dtype=torch.long)
            for i, s in enumerate(seqs):
                ids[i, :len(s)] = torch.tensor(s)
                mask[i, :len(s)] = 1
            ids, mask = ids.cuda(), mask.cuda()
            with torch.no_grad():
                logits = model(input_ids=ids, attention_mask=mask).logits.float()
            lp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:, None])[..., 0]
            lls = [lp[i, a - 1:e - 1].sum().item() for i, (a, e) in enumerate(spans)]
            for qi, q in enumerate(lines[b:b + batch]):
                mine = lls[4 * qi:4 * qi + 4]
                correct += max(range(4), key=lambda k: mine[k]) == q["answer"]
        return correct

    run(lines[:batch])  # warm-up
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    run(lines)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "questions_per_second": len(lines) / seconds, "batch_questions": batch}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--kiln", required=True)
    p.add_argument("--config", default=os.path.join(HERE, "configs", "llama-1b-shape.config.json"))
    p.add_argument("--questions", type=int, default=1000)
    p.add_argument("--hf-batch", type=int, default=32)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = os.path.join(tmp, "model")
        os.makedirs(model_dir)
        shutil.copy(a.config, os.path.join(model_dir, "config.json"))
        for f in ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"]:
            shutil.copy(os.path.join(ROOT, "testdata", "tiny-chat", f), model_dir)
        data = os.path.join(tmp, "questions.jsonl")
        make_questions(data, a.questions, 1)
        r = subprocess.run([a.kiln, "eval", "--task", "choice", "--model", model_dir, "--random-weights",
                            "--device", "cuda", "--data", data], capture_output=True, text=True)
        if r.returncode != 0:
            print(r.stderr, file=sys.stderr)
            sys.exit(1)
        kiln = json.loads(r.stdout)
        hf = hf_choice(model_dir, data, a.hf_batch)
        out = {"config": os.path.basename(a.config), "questions": a.questions,
               "kiln": {"seconds": kiln["seconds"], "questions_per_second": kiln["items_per_second"]},
               "transformers": hf,
               "speedup": kiln["items_per_second"] / hf["questions_per_second"]}
        print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
