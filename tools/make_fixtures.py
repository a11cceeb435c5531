"""Builds the reference-logit fixtures in tests/fixtures/ (see tests/fixtures/README.md).

Steps (each idempotent, deterministic seeds):
  prepare  (numpy only)  write config.json, weights, prompt.json for every fixture; choose prompts token by token
                         so that no router decision is near a tie; write logits.f32 for the NumPy-referenced
                         fixtures (k3-*) from tools/kimi_ref.py in float64.
  hf       (torch + transformers 5.17)  tools/hf_ref.py writes logits.f32 + hf_report.json for the kl-* fixtures.
  finish   (numpy only)  cross-check every fixture against the float64 NumPy reference, write notes.md.
  all      the three in a row (needs torch + transformers in this python).
  check    (numpy only)  finish's cross-checks and assertions without rewriting notes.md.

Usage: python3 tools/make_fixtures.py {prepare|hf|finish|all|check} [FIXTURE_ROOT] [--only NAME[,NAME]]"""
import copy
import json
import os
import subprocess
import sys

import numpy as np

TOOLS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, TOOLS)
from kimi_ref import KimiRef, load_checkpoint  # noqa: E402
from st_io import (BF16, bf16_bits, mxfp4_quant, read_header, read_safetensors,  # noqa: E402
                   write_safetensors)

ROOT = os.path.join(os.path.dirname(TOOLS), "tests", "fixtures")
MARGIN = 2e-3          # required gap between the k-th and (k+1)-th selection score (and kept/dropped groups)

# --------------------------------------------------------------------------------------------------------------
# configurations

KL_BASE = dict(
    vocab_size=512, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
    num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
    q_lora_rank=None, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
    mla_use_nope=True, num_experts=8, num_experts_per_token=2, num_shared_experts=1,
    first_k_dense_replace=1, moe_layer_freq=1, routed_scaling_factor=2.446, moe_renormalize=True,
    moe_router_activation_func="sigmoid", use_grouped_topk=True, num_expert_group=1, topk_group=1,
    topk_method="noaux_tc", hidden_act="silu", rms_norm_eps=1e-5, tie_word_embeddings=False,
    linear_attn_config={"kda_layers": [1, 3], "full_attn_layers": [2, 4],
                        "num_heads": 4, "head_dim": 16, "short_conv_kernel_size": 4},
    num_nextn_predict_layers=0, model_max_length=4096, pad_token_id=0, bos_token_id=1, eos_token_id=2)

K3_TEXT = dict(
    model_type="kimi_linear", vocab_size=512, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
    num_hidden_layers=7, num_attention_heads=4, num_key_value_heads=4,
    q_lora_rank=24, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
    mla_use_nope=True, mla_use_output_gate=True,
    num_experts=16, num_experts_per_token=4, num_shared_experts=2, routed_expert_hidden_size=32,
    latent_moe_use_norm=True, first_k_dense_replace=1, moe_layer_freq=1, routed_scaling_factor=1.0,
    moe_renormalize=True, moe_router_activation_func="sigmoid", use_grouped_topk=True, num_expert_group=1,
    topk_group=1, topk_method="noaux_tc", hidden_act="situ", activation_situ_beta=4.0,
    activation_situ_linear_beta=25.0, rms_norm_eps=1e-5, tie_word_embeddings=False, attn_res_block_size=3,
    linear_attn_config={"kda_layers": [1, 2, 3, 5], "full_attn_layers": [4, 6, 7],
                        "num_heads": 4, "head_dim": 8, "short_conv_kernel_size": 4,
                        "use_full_rank_gate": True, "gate_lower_bound": -5.0},
    num_nextn_predict_layers=0, model_max_length=4096, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    dtype="bfloat16")


def quant_config(ignore):
    return {
        "quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized", "quantization_status": "compressed",
        "config_groups": {"group_0": {
            "targets": ["Linear"], "format": "mxfp4-pack-quantized",
            "weights": {"num_bits": 4, "type": "float", "symmetric": True, "strategy": "group", "group_size": 32,
                        "dynamic": False, "observer": "minmax", "scale_dtype": "torch.uint8"},
            "input_activations": None, "output_activations": None}},
        "ignore": ignore, "kv_cache_scheme": None}


# name -> (kind, seed, overrides, prefill length, decode length, storage)
FIXTURES = {
    "kl-fp32": dict(kind="kl", seed=11, cfg={}, T=67, D=3, store="f32", dense="block_sparse_moe"),
    "kl-qlora-fp32": dict(kind="kl", seed=12, cfg={"q_lora_rank": 24}, T=37, D=4, store="f32",
                          dense="block_sparse_moe"),
    "kl-bf16": dict(kind="kl", seed=13, cfg={}, T=45, D=3, store="bf16", dense="block_sparse_moe"),
    "kl-grouped": dict(kind="kl", seed=14, cfg={"num_experts": 16, "num_experts_per_token": 4,
                                                "num_expert_group": 4, "topk_group": 2,
                                                "moe_intermediate_size": 16},
                       T=53, D=4, store="f32", dense="block_sparse_moe"),
    "kl-mxfp4": dict(kind="kl", seed=15, cfg={"moe_intermediate_size": 64}, T=71, D=3, store="mxfp4",
                     dense="mlp"),
    "k3-tiny": dict(kind="k3", seed=16, cfg={}, T=67, D=4, store="f32"),
    "k3-tiny-bf16": dict(kind="k3", seed=17, cfg={}, T=41, D=3, store="bf16"),
}

# --------------------------------------------------------------------------------------------------------------
# weights (checkpoint names, float64 master values)


def tensor_shapes(c, k3):
    d, V = c["hidden_size"], c["vocab_size"]
    la = c["linear_attn_config"]
    KH, KD, KC = la["num_heads"], la["head_dim"], la["short_conv_kernel_size"]
    P = KH * KD
    NH, Nq, NV, Lc, Nr = (c["num_attention_heads"], c["qk_nope_head_dim"] + c["qk_rope_head_dim"],
                          c["v_head_dim"], c["kv_lora_rank"], c["qk_rope_head_dim"])
    E, I, Ish = c["num_experts"], c["moe_intermediate_size"], c["moe_intermediate_size"] * c["num_shared_experts"]
    Dz = c.get("routed_expert_hidden_size") or d
    s = {"model.embed_tokens.weight": [V, d], "model.norm.weight": [d], "lm_head.weight": [V, d]}
    if k3:
        s["model.output_attn_res_norm.weight"] = [d]
        s["model.output_attn_res_proj.weight"] = [1, d]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        s[p + "input_layernorm.weight"] = [d]
        s[p + "post_attention_layernorm.weight"] = [d]
        if k3:
            for n in ("self_attention_res", "mlp_res"):
                s[p + n + "_norm.weight"] = [d]
                s[p + n + "_proj.weight"] = [1, d]
        a = p + "self_attn."
        if (i + 1) in la["kda_layers"]:
            for n in "qkv":
                s[a + n + "_proj.weight"] = [P, d]
                s[a + n + "_conv1d.weight"] = [P, 1, KC]
            s[a + "f_a_proj.weight"] = [KD, d]
            s[a + "f_b_proj.weight"] = [P, KD]
            s[a + "dt_bias"] = [P]
            s[a + "A_log"] = [KD] if k3 else [1, 1, KH, 1]
            s[a + "b_proj.weight"] = [KH, d]
            if k3:
                s[a + "g_proj.weight"] = [P, d]
            else:
                s[a + "g_a_proj.weight"] = [KD, d]
                s[a + "g_b_proj.weight"] = [P, KD]
            s[a + "o_norm.weight"] = [KD]
            s[a + "o_proj.weight"] = [d, P]
        else:
            if c.get("q_lora_rank"):
                r = c["q_lora_rank"]
                s[a + "q_a_proj.weight"] = [r, d]
                s[a + "q_a_layernorm.weight"] = [r]
                s[a + "q_b_proj.weight"] = [NH * Nq, r]
            else:
                s[a + "q_proj.weight"] = [NH * Nq, d]
            s[a + "kv_a_proj_with_mqa.weight"] = [Lc + Nr, d]
            s[a + "kv_a_layernorm.weight"] = [Lc]
            s[a + "kv_b_proj.weight"] = [NH * (Nq - Nr + NV), Lc]
            if k3:
                s[a + "g_proj.weight"] = [NH * NV, d]
            s[a + "o_proj.weight"] = [d, NH * NV]
        if i < c["first_k_dense_replace"]:
            m = p + "mlp."                                   # renamed later for save_pretrained style
            s[m + "gate_proj.weight"] = [c["intermediate_size"], d]
            s[m + "up_proj.weight"] = [c["intermediate_size"], d]
            s[m + "down_proj.weight"] = [d, c["intermediate_size"]]
        else:
            m = p + "block_sparse_moe."
            s[m + "gate.weight"] = [E, d]
            s[m + "gate.e_score_correction_bias"] = [E]
            if k3:
                s[m + "routed_expert_down_proj.weight"] = [Dz, d]
                s[m + "routed_expert_norm.weight"] = [Dz]
                s[m + "routed_expert_up_proj.weight"] = [d, Dz]
            for e in range(E):
                s[m + f"experts.{e}.w1.weight"] = [I, Dz]
                s[m + f"experts.{e}.w3.weight"] = [I, Dz]
                s[m + f"experts.{e}.w2.weight"] = [Dz, I]
            s[m + "shared_experts.gate_proj.weight"] = [Ish, d]
            s[m + "shared_experts.up_proj.weight"] = [Ish, d]
            s[m + "shared_experts.down_proj.weight"] = [d, Ish]
    return s


def make_weights(c, k3, rng, mx):
    """Every tensor perturbed away from HF's init (norms != 1, bias != 0), so that skipping one changes the logits."""
    KH = c["linear_attn_config"]["num_heads"]
    w = {}
    for name, shape in tensor_shapes(c, k3).items():
        if name.endswith("A_log"):
            if k3:                                            # per-head values, zero-padded to head_dim
                v = np.zeros(shape)
                v[:KH] = rng.uniform(-1, 2, KH)
            else:
                v = rng.uniform(-1, 2, shape)
        elif name.endswith("dt_bias"):
            v = rng.standard_normal(shape) * 0.5
        elif name.endswith("e_score_correction_bias"):
            v = rng.standard_normal(shape) * 0.05
        elif len(shape) == 1:
            v = 1 + 0.1 * rng.standard_normal(shape)
        else:
            v = rng.standard_normal(shape) * shape[-1] ** -0.5
            if k3 and ("up_proj" in name and "routed" not in name or name.endswith(".w3.weight")):
                v *= 4.0                                      # reach the SiTU linear cap (tanh(u/25)) region
            if k3 and (name.endswith("gate_proj.weight") or name.endswith(".w1.weight")):
                v *= 2.0                                      # and the gate cap (4 tanh(g/4))
            if name.endswith(("q_a_proj.weight", "kv_a_proj_with_mqa.weight")):
                v[:shape[0] if "q_a" in name else c["kv_lora_rank"]] *= 0.01   # small pre-norm latents: the
                #                                           1e-6 eps of q_a/kv_a_layernorm is visible
            if name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight"):
                v[:c["linear_attn_config"]["head_dim"]] *= 1e-3  # KDA head 0 of layer 0 gets |q|,|k| ~ 1e-3, so
                #                                           the l2norm's eps inside the sqrt is visible
            if mx and ".experts." in name:                    # vary the MXFP4 block scales within a row
                v *= np.repeat(np.exp2(rng.integers(-2, 2, (shape[0], shape[1] // 32))), 32, 1)
        w[name] = v
    return w


# --------------------------------------------------------------------------------------------------------------
# storage


def encode(w, store, k3, dense):
    """float64 master -> (tensors to write, dtype policy text).  Values written are the values referenced."""
    out = {}
    for name, v in w.items():
        fp32_always = name.endswith(("A_log", "dt_bias", "e_score_correction_bias")) or (k3 and (
            "conv1d" in name or "o_norm" in name))
        if ".experts." in name and (store == "mxfp4" or k3):
            packed, scale = mxfp4_quant(v)
            out[name[:-len("weight")] + "weight_packed"] = packed
            out[name[:-len("weight")] + "weight_scale"] = scale
        elif store == "bf16" and not fp32_always:
            out[name] = BF16(bf16_bits(v))
        else:
            out[name] = v.astype(np.float32)
    if dense == "block_sparse_moe":                          # save_pretrained renames every .mlp.
        out = {k.replace(".mlp.", ".block_sparse_moe."): v for k, v in out.items()}
    if k3:
        out = {"language_model." + k: v for k, v in out.items()}
        rng = np.random.default_rng(99)                      # dummy vision tensors, to be ignored
        out["vision_tower.encoder.blocks.0.attn.qkv.weight"] = BF16(bf16_bits(rng.standard_normal((48, 16))))
        out["mm_projector.proj.0.weight"] = BF16(bf16_bits(rng.standard_normal((64, 16))))
    return out


DTYPE_POLICY = {
    ("kl", "f32"): "all tensors F32.",
    ("kl", "bf16"): "BF16 for every tensor except `A_log`, `dt_bias`, `e_score_correction_bias` (F32, as in the "
                    "48B checkpoint); the reference used exactly these stored values widened to fp32.",
    ("kl", "mxfp4"): "routed experts `experts.{e}.w{1,2,3}` as compressed-tensors MXFP4 (`weight_packed` U8 "
                     "[out,in/2], low nibble = even column; `weight_scale` U8 [out,in/32] E8M0), everything else "
                     "F32; the reference used the exactly dequantised expert values.",
    ("k3", "f32"): "spine F32; routed experts MXFP4 (compressed-tensors layout); the reference used the "
                   "exactly dequantised expert values.",
    ("k3", "bf16"): "spine BF16 except `A_log`, `dt_bias`, `e_score_correction_bias`, `{q,k,v}_conv1d.weight`, "
                    "`o_norm.weight` (F32, as the K3 roster records); routed experts MXFP4; the reference used "
                    "exactly the stored values (BF16 widened, MXFP4 dequantised) in float64.",
}


def write_config(d, c, kind, store):
    if kind == "k3":
        ignore = ["lm_head", "re:.*self_attn.*", "re:.*mlp\\..*", "re:.*shared_experts.*",
                  "re:.*block_sparse_moe\\.gate$", "re:.*routed_expert_(down|up)_proj$", "re:.*vision_tower.*",
                  "re:.*mm_projector.*"]
        text = dict(c)
        text["dtype"] = "bfloat16" if store == "bf16" else "float32"
        top = {"model_type": "kimi_k3", "architectures": ["KimiK3ForConditionalGeneration"],
               "text_config": text,
               "vision_config": {"model_type": "moonvit", "patch_size": 14, "hidden_size": 16,
                                 "num_hidden_layers": 1, "num_attention_heads": 2},
               "media_placeholder_token_id": 505, "use_cache": True,
               "quantization_config": quant_config(ignore), "dtype": text["dtype"]}
    else:
        top = {"model_type": "kimi_linear", "architectures": ["KimiLinearForCausalLM"], **c,
               "dtype": "bfloat16" if store == "bf16" else "float32"}
        if store == "mxfp4":
            top["quantization_config"] = quant_config(
                ["lm_head", "re:.*self_attn.*", "re:.*mlp\\..*", "re:.*shared_experts.*",
                 "re:.*block_sparse_moe\\.gate$"])
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(top, f, indent=1)
        f.write("\n")


# --------------------------------------------------------------------------------------------------------------
# prompt choice and router margins


def router_summary(log):
    m = min(float(r["margin"].min()) for r in log)
    gm = [float(r["group_margin"].min()) for r in log if r["group_margin"] is not None]
    changed = sum(int(r["changed"].sum()) for r in log)
    total = sum(len(r["margin"]) for r in log)
    return m, (min(gm) if gm else None), changed, total


def choose_prompt(ref, T, D, rng, V):
    """Token by token: a candidate token is kept only if every MoE layer's decision at that position has the
    top-k (and group) margin >= MARGIN.  The model is causal, so earlier positions are never disturbed."""
    st, ids, tries = ref.new_state(), [], 0
    for _ in range(T + D):
        for attempt in range(500):
            tok = int(rng.integers(3, V))
            st2 = copy.deepcopy(st)
            ref.router_log = []
            ref.forward([tok], st2)
            m, gm, _, _ = router_summary(ref.router_log)
            tries += 1
            if m >= MARGIN and (gm is None or gm >= MARGIN):
                break
        else:
            raise RuntimeError("no token with a clear router margin")
        ids.append(tok)
        st = st2
    ref.router_log = None
    return ids[:T], ids[T:], tries


def prepare(root, names):
    for name in names:
        spec = FIXTURES[name]
        d = os.path.join(root, name)
        os.makedirs(d, exist_ok=True)
        for f in os.listdir(d):
            if f not in ("logits.f32", "hf_report.json", "notes.md"):
                os.remove(os.path.join(d, f))
        k3 = spec["kind"] == "k3"
        c = copy.deepcopy(K3_TEXT if k3 else KL_BASE)
        c.update(spec["cfg"])
        rng = np.random.default_rng(spec["seed"])
        w = make_weights(c, k3, rng, k3 or spec["store"] == "mxfp4")
        tensors = encode(w, spec["store"], k3, spec.get("dense"))
        write_safetensors(os.path.join(d, "model.safetensors"), tensors, {"format": "pt"})
        write_config(d, c, spec["kind"], spec["store"])
        cfg, wts = load_checkpoint(d)
        ref = KimiRef(cfg, wts)
        prefill, decode, tries = choose_prompt(ref, spec["T"], spec["D"], rng, c["vocab_size"])
        with open(os.path.join(d, "prompt.json"), "w") as f:
            json.dump({"prefill": prefill, "decode": decode}, f)
            f.write("\n")
        if k3:
            rows = ref.run_prompt(prefill, decode)
            rows.astype("<f4").tofile(os.path.join(d, "logits.f32"))
        else:                                                # stale HF logits would not match the new weights
            for f in ("logits.f32", "hf_report.json"):
                if os.path.exists(os.path.join(d, f)):
                    os.remove(os.path.join(d, f))
        print(f"{name}: prepared ({tries} candidate tokens tried for {spec['T'] + spec['D']} positions)")


# --------------------------------------------------------------------------------------------------------------
# cross-checks and notes


def probe_k3(ref):
    """Records how hard the K3-only paths are exercised: SiTU inputs, AttnRes mixing weights."""
    pr = {"g": 0.0, "u": 0.0, "alpha_min": 1.0, "alpha_max": 0.0, "out_candidates": 0}
    act, attn = ref.act_mul, ref.attn_res

    def act_mul(g, u):
        pr["g"], pr["u"] = max(pr["g"], float(np.abs(g).max())), max(pr["u"], float(np.abs(u).max()))
        return act(g, u)

    def attn_res(blocks, prefix, stem):
        v = np.stack(blocks + [prefix], 1)
        key = v / np.sqrt((v * v).mean(-1, keepdims=True) + ref.EPS)
        sc = (key * (ref.W[stem + "_norm.weight"] * ref.W[stem + "_proj.weight"].reshape(-1))).sum(-1)
        a = np.exp(sc - sc.max(1, keepdims=True))
        a /= a.sum(1, keepdims=True)
        pr["alpha_min"], pr["alpha_max"] = min(pr["alpha_min"], float(a.min())), max(pr["alpha_max"], float(a.max()))
        if stem == "model.output_attn_res":
            pr["out_candidates"] = len(blocks) + 1
        return attn(blocks, prefix, stem)

    ref.act_mul, ref.attn_res = act_mul, attn_res
    pr["restore"] = (act, attn)
    return pr


def misreadings(cfg, wts, k3):
    """name -> patch(ref): plausible wrong readings of the model's definition; each should move the logits well past the
    tolerance, which shows the fixture can tell them apart."""
    def per_channel_alog(r):                                  # exp(A_log[j]) per key channel, not per head
        r.decay_scale = lambda p: np.exp(r.W[p + "A_log"].reshape(-1)[:r.KD])[None, None, :]

    def clamp_l2(r):                                          # x / max(|x|, 1e-12), eps outside the sqrt
        r.l2norm = lambda x: x / np.maximum(np.sqrt((x * x).sum(-1, keepdims=True)), 1e-12)

    def no_output_attnres(r):
        f = r.attn_res
        r.attn_res = lambda b, p, stem: p if stem == "model.output_attn_res" else f(b, p, stem)

    v = {"MLA latent norms with eps 1e-5 instead of 1e-6": lambda r: setattr(r, "LATENT_EPS", 1e-5),
         "q/k L2 norm as max(norm, 1e-12)": clamp_l2}
    if k3:
        v.update({
            "A_log read per key channel": per_channel_alog,
            "KDA decay without gate_lower_bound (softplus form)": lambda r: setattr(r, "LB", None),
            "SwiGLU instead of SiTU": lambda r: setattr(r, "SITU", False),
            "SiTU without the linear cap on up": lambda r: setattr(r, "LBETA", None),
            "no routed_expert_norm": lambda r: setattr(r, "LATENT_NORM", False),
            "no output AttnRes": no_output_attnres,
        })
    else:
        v["A_log ignored (exp(A_log) = 1)"] = lambda r: setattr(r, "decay_scale", lambda p: 1.0)
    return v


def sensitivity(cfg, wts, k3, pre, dec, rows):
    out = {}
    for name, patch in misreadings(cfg, wts, k3).items():
        r = KimiRef(cfg, wts)
        patch(r)
        out[name] = float(np.abs(r.run_prompt(pre, dec) - rows).max())
    return out


def fmt(x):
    return "n/a" if x is None else f"{x:.3g}"


def finish(root, names, write=True):
    summary = []
    for name in names:
        spec = FIXTURES[name]
        d = os.path.join(root, name)
        k3 = spec["kind"] == "k3"
        cfg, wts = load_checkpoint(d)
        prompt = json.load(open(os.path.join(d, "prompt.json")))
        pre, dec = prompt["prefill"], prompt["decode"]
        ref = KimiRef(cfg, wts)
        ref.router_log = []
        probe = probe_k3(ref) if k3 else None
        rows = ref.run_prompt(pre, dec)
        if probe:
            ref.act_mul, ref.attn_res = probe.pop("restore")
        log = ref.router_log
        m, gm, changed, total = router_summary(log)
        ref.router_log = None
        whole = ref.forward(pre + dec, ref.new_state())      # one batch over every token, no decode steps
        st, cut = ref.new_state(), len(pre) // 2              # prefill in two batches, then the decode tokens
        split = np.concatenate([ref.forward(pre[:cut], st), ref.forward(pre[cut:] + dec, st)])
        lf = os.path.join(d, "logits.f32")
        if not os.path.exists(lf):
            print(f"{name}: no logits.f32 yet (run tools/hf_ref.py)")
            continue
        got = np.fromfile(lf, "<f4").reshape(rows.shape)
        r32 = KimiRef(cfg, wts, np.float32).run_prompt(pre, dec)
        T = len(pre)
        diff = np.abs(rows - got)
        stats = {
            "rows": rows.shape[0], "max_abs_logit": float(np.abs(got).max()),
            "np64_vs_fixture": float(diff.max()), "np64_vs_fixture_prefill": float(diff[:T].max()),
            "np64_vs_fixture_decode": float(diff[T:].max()),
            "np64_batch_vs_stepwise": float(max(np.abs(whole - rows).max(), np.abs(split - rows).max())),
            "np32_vs_np64": float(np.abs(r32 - rows).max()),
            "router_margin": m, "group_margin": gm, "group_changed": changed, "router_decisions": total,
        }
        if probe:
            stats["k3_probe"] = probe
        stats["sensitivity"] = sensitivity(cfg, wts, k3, pre, dec, rows)
        hf = None
        if not k3:
            hf = json.load(open(os.path.join(d, "hf_report.json")))
            hf_idx = hf.get("router_topk")
            if hf_idx is not None:                           # HF's chosen experts vs the NumPy ones, prefill
                ours = [sorted(map(int, x)) for r in log[:len(hf_idx)] for x in r["idx"][:T]]
                theirs = [sorted(x) for layer in hf_idx for x in layer]
                stats["hf_router_agree"] = sum(a == b for a, b in zip(ours, theirs))
                stats["hf_router_total"] = len(theirs)
        raw = read_safetensors(os.path.join(d, "model.safetensors"))
        scales = [v for k, v in raw.items() if k.endswith("weight_scale")]
        if scales:
            sc = np.concatenate([v.ravel() for v in scales])
            pk = np.concatenate([v.ravel() for k, v in raw.items() if k.endswith("weight_packed")])
            stats["mx_scale"] = (int(sc.min()), int(sc.max()), int(len(set((pk & 15).tolist() + (pk >> 4).tolist()))))
        tol = 1e-3 if not k3 else 1e-6
        assert stats["np64_vs_fixture"] < tol * max(1.0, stats["max_abs_logit"]), (name, stats)
        assert m >= MARGIN and (gm is None or gm >= MARGIN), (name, m, gm)
        if write:
            write_notes(d, name, spec, cfg, stats, hf)
        size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
        ref_txt = "NumPy float64 (`tools/kimi_ref.py`)" if k3 else f"HF transformers {hf['transformers']} fp32"
        cross = "n/a (is the reference)" if k3 else f"{stats['np64_vs_fixture']:.2g}"
        gm = f", groups {stats['group_margin']:.2g}" if stats["group_margin"] is not None else ""
        summary.append(f"| `{name}` | {len(pre)} + {len(dec)} | {ref_txt} | {cross} | {stats['np32_vs_np64']:.2g} | "
                       f"{stats['router_margin']:.2g}{gm} | {size / 1e6:.2f} MB |")
        print(f"{name}: " + ", ".join(f"{k}={fmt(v) if isinstance(v, float) else v}" for k, v in stats.items()))
    readme = os.path.join(root, "README.md")
    if write and names == list(FIXTURES) and os.path.exists(readme):
        head = ("| fixture | prefill + decode tokens | reference | max abs diff, NumPy float64 vs reference | "
                "NumPy float32 vs float64 | min router margin | size |\n|---|---|---|---|---|---|---|\n")
        txt = open(readme).read()
        a, b = txt.index("<!-- summary -->") + len("<!-- summary -->"), txt.index("<!-- /summary -->")
        with open(readme, "w") as f:
            f.write(txt[:a] + "\n" + head + "\n".join(summary) + "\n" + txt[b:])


def file_table(d):
    lines = []
    for f in sorted(os.listdir(d)):
        if f == "notes.md":
            continue
        lines.append(f"| `{f}` | {os.path.getsize(os.path.join(d, f))} |")
    return "\n".join(lines)


def write_notes(d, name, spec, cfg, s, hf):
    k3 = spec["kind"] == "k3"
    la = cfg["linear_attn_config"]
    hdr = read_header(os.path.join(d, "model.safetensors"))
    n_t = len([k for k in hdr if k != "__metadata__"])
    T, D = spec["T"], spec["D"]
    L = []
    L.append(f"# Fixture `{name}`\n")
    if k3:
        L.append("Kimi K3 layout (top-level `kimi_k3` config, text tensors under `language_model.`, two dummy vision "
                 "tensors to ignore), exercising every K3 feature at tiny size: SiTU-GLU (beta 4, linear beta 25) "
                 "in the dense layer, shared and routed experts; Block Attention Residuals "
                 f"(block size {cfg['attn_res_block_size']}, {cfg['num_hidden_layers']} layers, blocks pushed at "
                 f"layers {list(range(0, cfg['num_hidden_layers'], cfg['attn_res_block_size']))}, plus the output "
                 "AttnRes); latent MoE (routed_expert_hidden_size "
                 f"{cfg['routed_expert_hidden_size']}, routed_expert_down/up_proj, routed_expert_norm); MLA with q "
                 "LoRA and output gate; KDA with full-rank `g_proj` and gate_lower_bound -5; `A_log` stored "
                 f"[{la['head_dim']}] with entries {la['num_heads']}.. zero; MXFP4 routed experts; "
                 f"KDA layers {la['kda_layers']}, MLA layers {la['full_attn_layers']} (1-based).\n")
    else:
        what = {"kl-fp32": "plain `q_proj` MLA", "kl-qlora-fp32": f"MLA with q_lora_rank {cfg.get('q_lora_rank')}",
                "kl-bf16": "plain `q_proj`, weights stored BF16",
                "kl-grouped": (f"grouped routing: {cfg['num_experts']} experts in {cfg['num_expert_group']} groups, "
                               f"topk_group {cfg['topk_group']}, k {cfg['num_experts_per_token']}"),
                "kl-mxfp4": "routed experts stored as compressed-tensors MXFP4"}[name]
        L.append(f"Kimi-Linear (`kimi_linear`), {what}. KDA layers {la['kda_layers']}, MLA layers "
                 f"{la['full_attn_layers']} (1-based), dense FFN at layer 0, MoE after.\n")
    L.append("## Prompt and logits\n")
    L.append(f"`prompt.json`: {T} prefill tokens then {D} decode tokens. `logits.f32`: {T + D} rows x "
             f"{cfg['vocab_size']} little-endian float32; rows 0..{T - 1} = the prefill consumed as one batch "
             f"(row t = logits after token t), rows {T}..{T + D - 1} = each decode token fed singly with the "
             "cache.\n")
    L.append("## Reference\n")
    if k3:
        L.append("**The independent NumPy reference `tools/kimi_ref.py` in float64** (SiTU, Block Attention Residuals "
                 "and the latent MoE included), not Moonshot's code: transformers 5.17 cannot build K3 and Moonshot's remote code was "
                 "not run. The Kimi-Linear parts of the same code match transformers 5.17 on the `kl-*` fixtures "
                 "(see their notes); the K3-only branches rest on public ports of the K3 code, not on an executed K3 "
                 "reference. MLA latent norms use eps 1e-6. Expert outputs are summed in float64 in router rank "
                 "order; no bf16 rounding of activations anywhere.\n")
    else:
        L.append(f"transformers {hf['transformers']} `KimiLinearForCausalLM` (torch {hf['torch']}, pure PyTorch "
                 f"path, {'fla not installed' if not hf['fla_installed'] else 'WARNING: fla installed'}), "
                 f"float32 on {hf['device']}, eager attention, "
                 f"loaded with `{hf['load']}`. Prefill = one call with `use_cache=True`, then one call per decode "
                 "token with the returned cache.\n")
        if hf.get("grouped_note"):
            L.append(hf["grouped_note"] + "\n")
    act = "Activations float64 (NumPy)." if k3 else "Activations float32 (HF); cross-check in float64 (NumPy)."
    L.append(f"Dtype policy: {DTYPE_POLICY[(spec['kind'], spec['store'])]} {act}\n")
    if name == "kl-bf16":
        L.append("(transformers' own `save_pretrained` of a bf16 model writes every tensor BF16, `A_log` and "
                 "`dt_bias` included; this fixture keeps those F32 like the published 48B checkpoint, so a loader "
                 "must take each tensor's dtype from the header.)\n")
    L.append("## Weights\n")
    wl = [f"Seed {spec['seed']} (`tools/make_fixtures.py`). Every tensor is perturbed away from HF's init, so "
             "that skipping a norm or bias changes the logits: `A_log` ~ U(-1, 2), `dt_bias` ~ N(0, 0.5^2), `e_score_correction_bias` "
             "~ N(0, 0.05^2), every other 1-D weight (all norms) 1 + 0.1 N(0,1), matrices N(0,1)/sqrt(in). "
          "`q_a_proj` and the latent rows of `kv_a_proj_with_mqa` are scaled by 0.01 (pre-norm RMS ~0.01, so the "
          "1e-6 eps of `q_a_layernorm`/`kv_a_layernorm` matters), and in layer 0 the `q_proj`/`k_proj` rows of "
          "KDA head 0 by 1e-3 (so the eps inside the q/k L2 norm's sqrt matters)."]
    if k3:
        wl.append("K3 extras: gate projections (`gate_proj`, `w1`) x2 and up projections (`up_proj`, `w3`) x4 so "
                 "that SiTU's caps (4 tanh(g/4), 25 tanh(u/25)) change the result visibly; `A_log` entries past the "
                 f"{la['num_heads']} heads are exactly 0.")
    if s.get("mx_scale"):
        lo, hi, ncode = s["mx_scale"]
        wl.append(f"MXFP4 experts: each 32-column block scaled by a random power of two (2^-2..2^1) before "
                 "quantising (nearest E2M1 value, smallest power-of-two scale that avoids clipping), so scales vary "
                 f"within a row; E8M0 scale bytes span {lo}..{hi}, {ncode} of the 16 E2M1 codes occur.")
    L.append(" ".join(wl) + "\n")
    L.append("## Measured\n")
    L.append("| check | max abs diff |\n|---|---|")
    if not k3:
        L.append(f"| NumPy float64 reference vs these logits (HF fp32), all rows | {fmt(s['np64_vs_fixture'])} |")
        L.append(f"| ... prefill rows / decode rows | {fmt(s['np64_vs_fixture_prefill'])} / "
                 f"{fmt(s['np64_vs_fixture_decode'])} |")
        L.append(f"| HF: one uncached batch over all {T + D} tokens vs these rows | {fmt(hf['hf_batch_vs_rows'])} |")
        if hf.get("hf_reload_vs_rows") is not None:
            L.append(f"| HF: save_pretrained -> from_pretrained again vs these rows | {fmt(hf['hf_reload_vs_rows'])} |")
    else:
        L.append(f"| NumPy float64 recomputed vs these logits | {fmt(s['np64_vs_fixture'])} |")
    L.append(f"| NumPy float64: all {T + D} tokens as one batch, or the prefill split in two cached batches, vs "
             "prefill+decode rows | "
             f"{fmt(s['np64_batch_vs_stepwise'])} |")
    L.append(f"| NumPy float32 (same code) vs NumPy float64 | {fmt(s['np32_vs_np64'])} |")
    if s.get("k3_probe"):
        q = s["k3_probe"]
        L.append(f"\nK3 paths exercised: SiTU gate inputs reach |g| = {q['g']:.3g}, up inputs |u| = {q['u']:.3g} "
                 f"(caps at 4 and 25 matter); AttnRes softmax weights range "
                 f"{q['alpha_min']:.3g}..{q['alpha_max']:.3g}; "
                 f"the output AttnRes mixes {q['out_candidates']} candidates (stored blocks + the partial block).")
    tol = max(1e-4, 4 * max(s["np32_vs_np64"], s["np64_vs_fixture"] if not k3 else 0))
    L.append(f"\nmax |logit| = {s['max_abs_logit']:.3g}. An fp32 engine should land within about "
             f"{float(f'{tol:.1g}'):g} (absolute, max over all rows) of these logits.\n")
    L.append("How far plausible misreadings of the spec move the float64 reference (max |delta logit|, all rows):\n")
    L.append("| misreading | max abs change |\n|---|---|")
    for k, v in s["sensitivity"].items():
        L.append(f"| {k} | {fmt(v)}{' (below tolerance: not detected)' if v < tol else ''} |")
    L.append("")
    L.append("Router: prompt tokens were chosen one at a time (seeded), rejecting any token whose routing at some "
             f"MoE layer had a top-k gap below {MARGIN:g}. Minimum gap between the k-th and (k+1)-th selection "
             f"score (sigmoid + correction bias) over all {s['router_decisions']} token x layer decisions "
             f"(prefill and decode): **{s['router_margin']:.3g}**.")
    rl = [L.pop()]
    if s["group_margin"] is not None:
        rl.append(f"Minimum gap between the last kept and first dropped group score: **{s['group_margin']:.3g}**. "
                 f"Group-limited selection differs from plain top-{cfg['num_experts_per_token']} in "
                 f"{s['group_changed']} of {s['router_decisions']} decisions, so a router that ignores groups "
                 "fails this fixture.")
    if s.get("hf_router_total"):
        rl.append(f"HF's chosen experts (prefill, captured from its router) equal the NumPy reference's in "
                 f"{s['hf_router_agree']} of {s['hf_router_total']} token x layer decisions.")
    L.append(" ".join(rl) + "\n")
    if hf and hf.get("names_vs_save_pretrained"):
        L.append("## Tensor names\n")
        L.append(hf["names_vs_save_pretrained"] + "\n")
        if spec.get("dense") == "mlp":
            L.append("On purpose: this fixture names the dense layer-0 FFN `model.layers.0.mlp.*` as the published "
                     "checkpoints do, while the other `kl-*` fixtures use `block_sparse_moe.*` as `save_pretrained` "
                     "writes it; a loader must accept both.\n")
    L.append(f"## Files\n\n`model.safetensors` holds {n_t} tensors.\n\n| file | bytes |\n|---|---|")
    L.append(file_table(d))
    L.append("\nRegenerate: see `tests/fixtures/README.md`.\n")
    with open(os.path.join(d, "notes.md"), "w") as f:
        f.write("\n".join(L))


def main():
    argv, names = sys.argv[1:], list(FIXTURES)
    if "--only" in argv:
        i = argv.index("--only")
        names, argv = argv[i + 1].split(","), argv[:i] + argv[i + 2:]
    step = argv[0] if argv else "all"
    root = argv[1] if len(argv) > 1 else ROOT
    if step in ("prepare", "all"):
        prepare(root, names)
    if step in ("hf", "all"):
        kl = [n for n in names if FIXTURES[n]["kind"] == "kl"]
        if kl:
            subprocess.check_call([sys.executable, os.path.join(TOOLS, "hf_ref.py"), root] + kl)
    if step in ("finish", "all"):
        finish(root, names)
    if step == "check":                                      # verify without rewriting anything
        finish(root, names, write=False)


if __name__ == "__main__":
    main()
