"""Independent NumPy reference of the Kimi-Linear / Kimi K3 text forward, written from the public model
definitions (Kimi-Linear's modeling code, ports of K3's), not from this repository's C code.

Written as a class so the fixture builder can instrument the router, run in float64 (default) or float32, and
consume a prompt the way the fixtures define it
(prefill as one batch, then each decode token singly with the cache).  Reads checkpoint-style safetensors
(Kimi-Linear names, or K3 names under `language_model.`; BF16 widened exactly, MXFP4 experts dequantised exactly).

Usage: python3 tools/kimi_ref.py FIXTURE_DIR [--f32]
  computes the fixture's logits and, if FIXTURE_DIR/logits.f32 exists, prints the max difference to it."""
import glob
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from st_io import mxfp4_dequant, read_safetensors  # noqa: E402

np.seterr(over="ignore")


def load_checkpoint(model_dir):
    """(text config dict, weights dict with `language_model.` stripped, MXFP4 dequantised, vision dropped)."""
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    cfg = cfg.get("text_config", cfg)
    raw = {}
    for f in sorted(glob.glob(os.path.join(model_dir, "*.safetensors"))):
        raw.update(read_safetensors(f))
    w = {}
    for k, v in raw.items():
        if k.startswith("language_model."):
            k = k[len("language_model."):]
        if k.startswith(("model.", "lm_head.")):
            w[k] = v
    for k in [k for k in w if k.endswith(".weight_packed")]:
        base = k[:-len("_packed")]
        w[base] = mxfp4_dequant(w.pop(k), w.pop(base + "_scale"))
    return cfg, w


class KimiRef:
    def __init__(self, cfg, weights, dtype=np.float64):
        self.C, self.dt = cfg, dtype
        self.W = {k: np.asarray(v, dtype=np.float64).astype(dtype) for k, v in weights.items()}
        C = cfg
        self.EPS, self.L = C["rms_norm_eps"], C["num_hidden_layers"]
        la = C["linear_attn_config"]
        self.KDA_LAYERS = set(la["kda_layers"])                       # 1-based
        self.KH, self.KD, self.KC = la["num_heads"], la["head_dim"], la.get("short_conv_kernel_size", 4)
        self.LB = la.get("gate_lower_bound")
        self.NH, self.NOPE, self.ROPE = C["num_attention_heads"], C["qk_nope_head_dim"], C["qk_rope_head_dim"]
        self.VD, self.KVR = C["v_head_dim"], C["kv_lora_rank"]
        self.TOPK = C["num_experts_per_token"]
        self.RSF = C.get("routed_scaling_factor", 1.0)
        self.G, self.TG = C.get("num_expert_group", 1) or 1, C.get("topk_group", 1) or 1
        self.FIRST_DENSE, self.FREQ = C.get("first_k_dense_replace", 1), C.get("moe_layer_freq", 1)
        self.BLK = C.get("attn_res_block_size")
        self.SITU = C.get("hidden_act") == "situ"
        self.BETA = C.get("activation_situ_beta") or 1.0
        self.LBETA = C.get("activation_situ_linear_beta")
        self.LATENT_NORM = C.get("latent_moe_use_norm", True)
        self.LATENT_EPS = 1e-6                                        # q_a/kv_a_layernorm
        self.router_log = None                                        # list to collect router margins into

    # --- basic ops -----------------------------------------------------------------------------------------
    @staticmethod
    def sig(x):
        return 1.0 / (1.0 + np.exp(-x))

    def rms(self, x, w, eps):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w

    def lin(self, x, name):
        return x @ self.W[name].T

    def act_mul(self, g, u):                                          # SwiGLU, or SiTU-GLU (K3)
        if not self.SITU:
            return g * self.sig(g) * u
        if self.LBETA:
            u = self.LBETA * np.tanh(u / self.LBETA)
        return self.BETA * np.tanh(g / self.BETA) * self.sig(g) * u

    @staticmethod
    def l2norm(x):                                                    # eps inside the sqrt
        return x / np.sqrt((x * x).sum(-1, keepdims=True) + 1e-6)

    def decay_scale(self, p):                                         # exp(A_log), one value per KDA head
        return np.exp(self.W[p + "A_log"].reshape(-1)[:self.KH])[None, :, None]

    def ffn(self, x, p):
        return self.lin(self.act_mul(self.lin(x, p + "gate_proj.weight"), self.lin(x, p + "up_proj.weight")),
                        p + "down_proj.weight")

    def expert(self, x, p):
        return self.lin(self.act_mul(self.lin(x, p + "w1.weight"), self.lin(x, p + "w3.weight")), p + "w2.weight")

    # --- KDA ----------------------------------------------------------------------------------------------
    def kda(self, x, p, st):
        W, KH, KD, KC = self.W, self.KH, self.KD, self.KC
        T, P = x.shape[0], KH * KD
        pre = np.concatenate([self.lin(x, p + n + "_proj.weight") for n in "qkv"], 1)       # [T, 3P]
        wc = np.concatenate([W[p + n + "_conv1d.weight"].reshape(P, KC) for n in "qkv"])     # [3P, KC]
        hist = np.concatenate([st["conv"], pre])                                            # [KC-1+T, 3P]
        y = sum(hist[j:j + T] * wc[:, j] for j in range(KC))
        st["conv"] = hist[T:]                                                                # last KC-1 inputs
        y = y * self.sig(y)
        q, k, v = (y[:, i * P:(i + 1) * P].reshape(T, KH, KD) for i in range(3))
        f = self.lin(self.lin(x, p + "f_a_proj.weight"), p + "f_b_proj.weight") + W[p + "dt_bias"].reshape(-1)
        f = f.reshape(T, KH, KD)
        a = self.decay_scale(p)
        if self.LB is None:
            g = -a * np.where(f > 20, f, np.log1p(np.exp(np.minimum(f, 20))))
        else:
            g = self.LB * self.sig(a * f)
        beta = self.sig(self.lin(x, p + "b_proj.weight"))                                  # [T, KH]
        S, o = st["S"], np.empty((T, KH, KD), dtype=x.dtype)
        for t in range(T):
            qt = self.l2norm(q[t]) / np.sqrt(KD)
            kt = self.l2norm(k[t])
            S = S * np.exp(g[t])[:, :, None]                        # decay key-channel rows
            u = beta[t][:, None] * (v[t] - np.einsum("hkv,hk->hv", S, kt))
            S = S + kt[:, :, None] * u[:, None, :]
            o[t] = np.einsum("hkv,hk->hv", S, qt)                   # output reads the updated state
        st["S"] = S
        if p + "g_proj.weight" in W:                                # K3 full-rank output gate
            gate = self.lin(x, p + "g_proj.weight")
        else:
            gate = self.lin(self.lin(x, p + "g_a_proj.weight"), p + "g_b_proj.weight")
        o = self.rms(o, W[p + "o_norm.weight"], self.EPS) * self.sig(gate.reshape(T, KH, KD))
        return self.lin(o.reshape(T, P), p + "o_proj.weight")

    # --- MLA, NoPE, absorbed form ------------------------------------------------------------------------
    def mla(self, x, p, st):
        W, NH, NOPE, ROPE, VD, KVR = self.W, self.NH, self.NOPE, self.ROPE, self.VD, self.KVR
        T = x.shape[0]
        if p + "q_proj.weight" in W:
            q = self.lin(x, p + "q_proj.weight")
        else:
            q = self.lin(self.rms(self.lin(x, p + "q_a_proj.weight"), W[p + "q_a_layernorm.weight"], self.LATENT_EPS),
                         p + "q_b_proj.weight")
        q = q.reshape(T, NH, NOPE + ROPE)
        ckv = self.lin(x, p + "kv_a_proj_with_mqa.weight")
        st["c"] = np.concatenate([st["c"], self.rms(ckv[:, :KVR], W[p + "kv_a_layernorm.weight"], self.LATENT_EPS)])
        st["r"] = np.concatenate([st["r"], ckv[:, KVR:]])
        S = st["c"].shape[0]
        pos = S - T + np.arange(T)
        wkv = W[p + "kv_b_proj.weight"].reshape(NH, NOPE + VD, KVR)
        qlat = np.einsum("thn,hnl->thl", q[:, :, :NOPE], wkv[:, :NOPE])                 # absorbed W_UK
        s = np.einsum("thl,sl->hts", qlat, st["c"]) + np.einsum("thr,sr->hts", q[:, :, NOPE:], st["r"])
        s = np.where(np.arange(S)[None, None, :] <= pos[None, :, None], s / np.sqrt(NOPE + ROPE), -np.inf)
        pr = np.exp(s - s.max(-1, keepdims=True))
        pr /= pr.sum(-1, keepdims=True)
        o = np.einsum("hvl,thl->thv", wkv[:, NOPE:], np.einsum("hts,sl->thl", pr, st["c"]))  # absorbed W_UV
        o = o.reshape(T, NH * VD)
        if p + "g_proj.weight" in W:                                # K3 MLA output gate
            o = o * self.sig(self.lin(x, p + "g_proj.weight"))
        return self.lin(o, p + "o_proj.weight")

    # --- MoE (and K3's latent form) -------------------------------------------------------------------------
    def route(self, x, p, layer):
        T, G, TG, K = x.shape[0], self.G, self.TG, self.TOPK
        s = self.sig(self.lin(x, p + "gate.weight"))
        choice = s + self.W[p + "gate.e_score_correction_bias"]
        plain = np.argsort(-choice, axis=1, kind="stable")[:, :K]
        gmargin = None
        if G > 1 and TG < G:
            top2 = np.sort(choice.reshape(T, G, -1), -1)[:, :, -2:].sum(-1)
            order = np.argsort(-top2, 1, kind="stable")
            keep = np.zeros((T, G), bool)
            np.put_along_axis(keep, order[:, :TG], True, 1)
            gs = np.sort(top2, 1)[:, ::-1]
            gmargin = gs[:, TG - 1] - gs[:, TG]
            choice = np.where(np.repeat(keep, choice.shape[1] // G, 1), choice, -np.inf)
        idx = np.argsort(-choice, axis=1, kind="stable")[:, :K]
        if self.router_log is not None:
            cs = np.sort(choice, 1)[:, ::-1]
            self.router_log.append({
                "layer": layer, "margin": cs[:, K - 1] - cs[:, K], "group_margin": gmargin,
                "changed": np.array([set(a) != set(b) for a, b in zip(idx.tolist(), plain.tolist())]),
                "idx": idx.copy()})
        w = np.take_along_axis(s, idx, 1)
        if self.C.get("moe_renormalize", True):
            w = w / (w.sum(1, keepdims=True) + 1e-20)
        return idx, w * self.RSF

    def moe(self, x, p, layer):
        W = self.W
        idx, w = self.route(x, p, layer)
        latent = p + "routed_expert_down_proj.weight" in W
        z = self.lin(x, p + "routed_expert_down_proj.weight") if latent else x
        y = np.zeros((x.shape[0], z.shape[1]), dtype=x.dtype)
        for t in range(x.shape[0]):
            for j, e in enumerate(idx[t]):
                y[t] += w[t, j] * self.expert(z[t:t + 1], f"{p}experts.{e}.")[0]
        if latent:
            if self.LATENT_NORM:
                y = self.rms(y, W[p + "routed_expert_norm.weight"], self.EPS)
            y = self.lin(y, p + "routed_expert_up_proj.weight")
        return y + self.ffn(x, p + "shared_experts.")

    # --- Block Attention Residuals -----------------------------------------------------------------------
    def attn_res(self, blocks, prefix, stem):
        v = np.stack(blocks + [prefix], 1)                                                 # [T, n, d]
        key = v / np.sqrt((v * v).mean(-1, keepdims=True) + self.EPS)
        sc = (key * (self.W[stem + "_norm.weight"] * self.W[stem + "_proj.weight"].reshape(-1))).sum(-1)
        a = np.exp(sc - sc.max(1, keepdims=True))
        a /= a.sum(1, keepdims=True)
        return (a[:, :, None] * v).sum(1)

    # --- layers --------------------------------------------------------------------------------------------
    def layer(self, i, h, st, blocks):
        W, EPS = self.W, self.EPS
        p = f"model.layers.{i}."
        mixer = self.kda if (i + 1) in self.KDA_LAYERS else self.mla
        if i >= self.FIRST_DENSE and i % self.FREQ == 0:
            def mlp(m):
                return self.moe(m, p + "block_sparse_moe.", i)
        else:
            pre = p + "mlp." if p + "mlp.gate_proj.weight" in W else p + "block_sparse_moe."

            def mlp(m):
                return self.ffn(m, pre)
        if self.BLK is None:                                         # ordinary pre-norm residuals
            h = h + mixer(self.rms(h, W[p + "input_layernorm.weight"], EPS), p + "self_attn.", st[i])
            return h + mlp(self.rms(h, W[p + "post_attention_layernorm.weight"], EPS)), blocks
        prefix = h                                                   # K3 block attention residuals
        x = self.attn_res(blocks, prefix, p + "self_attention_res") if blocks else prefix
        if i % self.BLK == 0:
            blocks, prefix = blocks + [prefix], None
        a = mixer(self.rms(x, W[p + "input_layernorm.weight"], EPS), p + "self_attn.", st[i])
        prefix = a if prefix is None else prefix + a
        y = self.attn_res(blocks, prefix, p + "mlp_res")
        return prefix + mlp(self.rms(y, W[p + "post_attention_layernorm.weight"], EPS)), blocks

    def new_state(self):
        z = np.zeros
        return [{"S": z((self.KH, self.KD, self.KD), self.dt), "conv": z((self.KC - 1, 3 * self.KH * self.KD), self.dt)}
                if (i + 1) in self.KDA_LAYERS else
                {"c": z((0, self.KVR), self.dt), "r": z((0, self.ROPE), self.dt)} for i in range(self.L)]

    def forward(self, ids, st):
        h, blocks = self.W["model.embed_tokens.weight"][np.asarray(ids)], []
        for i in range(self.L):
            h, blocks = self.layer(i, h, st, blocks)
        if self.BLK is not None:
            h = self.attn_res(blocks, h, "model.output_attn_res")
        return self.lin(self.rms(h, self.W["model.norm.weight"], self.EPS), "lm_head.weight")

    def run_prompt(self, prefill, decode):
        """Fixture rows: prefill consumed as one batch (a row per token), then each decode token singly."""
        st = self.new_state()
        rows = [self.forward(prefill, st)]
        for t in decode:
            rows.append(self.forward([t], st))
        return np.concatenate(rows)


def main():
    d = sys.argv[1]
    dtype = np.float32 if "--f32" in sys.argv else np.float64
    cfg, w = load_checkpoint(d)
    ref = KimiRef(cfg, w, dtype)
    prompt = json.load(open(os.path.join(d, "prompt.json")))
    rows = ref.run_prompt(prompt["prefill"], prompt["decode"])
    print(f"{d}: {rows.shape[0]} rows x {rows.shape[1]} logits, max|logit| {np.abs(rows).max():.4g}")
    lf = os.path.join(d, "logits.f32")
    if os.path.exists(lf):
        want = np.fromfile(lf, "<f4").reshape(rows.shape)
        print(f"max|numpy - logits.f32| = {np.abs(rows - want).max():.3g}")


if __name__ == "__main__":
    main()
