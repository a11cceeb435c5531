#!/usr/bin/env python3
"""to_gguf.py — converts a Kimi-Linear checkpoint (safetensors, as `deltafin synth --family kimi-linear`
writes it, or a real one) into one GGUF file that llama.cpp loads, so both engines can be timed on the same
weights.

It follows llama.cpp's own Kimi-Linear conversion (conversion/kimi_linear.py and the base class in the
llama.cpp release bundled by the npm package node-llama-cpp): the same tensor names and metadata keys, conv
weights reshaped to [d_conv, 1, d_inner, 1], A_log stored as -exp(A_log), dt_bias renamed to ssm_dt.bias,
kv_b_proj split into k_b (transposed per head) and v_b, and each layer's routed experts stacked into one
3-D tensor. BF16 and F32 tensors are copied bit for bit; MXFP4 experts (compressed-tensors layout: packed
nibbles, element 2i low, plus one E8M0 scale per 32 values) are repacked losslessly into ggml's block_mxfp4
(scale byte, then 16 bytes holding element j low and j+16 high). Only the standard library is used, so it
runs where neither torch nor numpy is installed; it streams, so memory stays at about one layer's experts.

A checkpoint without a tokenizer (synthetic ones) gets a byte-level vocabulary: 256 byte tokens, names
"[PADi]" for the other ids, the config's BOS/EOS ids as control tokens, and no merges, so any text is one
token per byte in llama.cpp (id = byte value) and its output spells out the ids it generated.

usage: tools/to_gguf.py MODEL_DIR OUT.gguf
"""
import json
import math
import os
import struct
import sys

ALIGN = 32
GGML_F32, GGML_F16, GGML_BF16, GGML_MXFP4 = 0, 1, 30, 39
FTYPE_MOSTLY_BF16, FTYPE_MOSTLY_MXFP4_MOE = 32, 38
V_UINT32, V_INT32, V_FLOAT32, V_BOOL, V_STRING, V_ARRAY = 4, 5, 6, 7, 8, 9
TOK_NORMAL, TOK_CONTROL = 1, 3
ST_TYPES = {"F32": (GGML_F32, 4), "BF16": (GGML_BF16, 2), "F16": (GGML_F16, 2), "U8": (None, 1)}


# ---- reading safetensors -------------------------------------------------------------------------------

class Checkpoint:
    """Every tensor of the folder's shards: name -> (path, dtype, shape, absolute offset, bytes)."""

    def __init__(self, folder):
        self.folder = folder
        self.tensors = {}
        shards = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
        if not shards:
            sys.exit(f"{folder}: no .safetensors files")
        for shard in shards:
            path = os.path.join(folder, shard)
            with open(path, "rb") as f:
                (hlen,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(hlen))
            for name, info in header.items():
                if name == "__metadata__":
                    continue
                start, end = info["data_offsets"]
                self.tensors[name] = (path, info["dtype"], list(info["shape"]), 8 + hlen + start, end - start)

    def read(self, name):
        path, _, _, off, n = self.tensors[name]
        with open(path, "rb") as f:
            f.seek(off)
            data = f.read(n)
        if len(data) != n:
            sys.exit(f"{path}: tensor {name} is truncated")
        return data

    def strip_prefix(self):
        """K3-style checkpoints prefix the text model with 'language_model.'; Kimi-Linear does not."""
        if all(k.startswith("language_model.") for k in self.tensors):
            self.tensors = {k[len("language_model."):]: v for k, v in self.tensors.items()}


# ---- tensor transforms ---------------------------------------------------------------------------------

def bf16_to_f32(b):
    return struct.unpack(f"<{len(b) // 2}f", b"".join(b"\0\0" + b[i:i + 2] for i in range(0, len(b), 2)))


def f32_bytes(vals):
    return struct.pack(f"<{len(vals)}f", *vals)


def as_f32(data, dtype):
    if dtype == "F32":
        return struct.unpack(f"<{len(data) // 4}f", data)
    if dtype == "BF16":
        return bf16_to_f32(data)
    sys.exit(f"A_log has dtype {dtype}, expected F32 or BF16")


_LO = bytes(x & 15 for x in range(256))
_LO_HI = bytes((x & 15) << 4 for x in range(256))
_HI = bytes(x >> 4 for x in range(256))
_HI_HI = bytes(x & 0xF0 for x in range(256))


def _or(a, b):
    n = len(a)
    return (int.from_bytes(a, "little") | int.from_bytes(b, "little")).to_bytes(n, "little")


def repack_mxfp4(packed, scale):
    """compressed-tensors MXFP4 (rows of packed nibbles + E8M0 scales) -> ggml block_mxfp4 bytes."""
    nb = len(packed) // 16
    if len(scale) != nb:
        sys.exit(f"MXFP4 scale count {len(scale)} does not match {nb} blocks")
    out = bytearray(nb * 17)
    out[0::17] = scale
    for i in range(8):
        a, b = packed[i::16], packed[8 + i::16]
        out[1 + 2 * i::17] = _or(a.translate(_LO), b.translate(_LO_HI))     # elements 2i and 2i+16
        out[2 + 2 * i::17] = _or(a.translate(_HI), b.translate(_HI_HI))     # elements 2i+1 and 2i+17
    return bytes(out)


def split_kv_b(data, elem, heads, nope, vdim, kv_lora):
    """kv_b [H*(nope+v), kv_lora] -> k_b [H, kv_lora, nope] (transposed per head) and v_b [H, v, kv_lora]."""
    row = kv_lora * elem
    kb, vb = bytearray(), bytearray()
    for h in range(heads):
        base = h * (nope + vdim) * row
        k_rows = [data[base + r * row: base + (r + 1) * row] for r in range(nope)]
        for c in range(kv_lora):
            for r in range(nope):
                kb += k_rows[r][c * elem:(c + 1) * elem]
        vb += data[base + nope * row: base + (nope + vdim) * row]
    return bytes(kb), bytes(vb)


# ---- writing GGUF ----------------------------------------------------------------------------------------

def gguf_str(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


class Gguf:
    def __init__(self):
        self.kv = []
        self.tensors = []   # (name, ggml dims (fastest first), ggml type, nbytes, producer)

    def add(self, key, vtype, value):
        self.kv.append((key, vtype, value))

    def add_tensor(self, name, shape, gtype, nbytes, producer):
        self.tensors.append((name, list(reversed(shape)), gtype, nbytes, producer))

    @staticmethod
    def _value(vtype, v):
        if vtype == V_UINT32:
            return struct.pack("<I", v)
        if vtype == V_INT32:
            return struct.pack("<i", v)
        if vtype == V_FLOAT32:
            return struct.pack("<f", v)
        if vtype == V_BOOL:
            return struct.pack("<B", 1 if v else 0)
        if vtype == V_STRING:
            return gguf_str(v)
        raise ValueError(vtype)

    def _kv_bytes(self, key, vtype, value):
        out = gguf_str(key) + struct.pack("<I", vtype)
        if vtype != V_ARRAY:
            return out + self._value(vtype, value)
        etype, items = value
        out += struct.pack("<IQ", etype, len(items))
        return out + b"".join(self._value(etype, v) for v in items)

    def write(self, path):
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(b"GGUF" + struct.pack("<IQQ", 3, len(self.tensors), len(self.kv)))
            for k in self.kv:
                f.write(self._kv_bytes(*k))
            offset = 0
            for name, dims, gtype, nbytes, _ in self.tensors:
                f.write(gguf_str(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims))
                f.write(struct.pack("<IQ", gtype, offset))
                offset += (nbytes + ALIGN - 1) // ALIGN * ALIGN
            f.write(b"\0" * (-f.tell() % ALIGN))
            for name, _, _, nbytes, producer in self.tensors:
                written = 0
                for chunk in producer():
                    f.write(chunk)
                    written += len(chunk)
                if written != nbytes:
                    sys.exit(f"tensor {name}: wrote {written} bytes, expected {nbytes}")
                f.write(b"\0" * (-written % ALIGN))
                print(f"  {name}", file=sys.stderr)
        os.replace(tmp, path)


# ---- the conversion ----------------------------------------------------------------------------------------

def byte_token(b):
    """GPT-2's printable stand-in for a raw byte, as llama.cpp's BPE vocabularies store byte tokens."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    if b in printable:
        return chr(b)
    return chr(256 + sorted(set(range(256)) - set(printable)).index(b))


def add_metadata(g, cfg, arch, n_layers, full_attn, experts_dtype):
    la = cfg["linear_attn_config"]
    a = arch
    g.add("general.architecture", V_STRING, a)
    g.add("general.name", V_STRING, os.path.basename(os.path.abspath(sys.argv[1])))
    g.add("general.alignment", V_UINT32, ALIGN)
    g.add(f"{a}.block_count", V_UINT32, n_layers)
    g.add(f"{a}.context_length", V_UINT32, int(cfg.get("model_max_length", cfg.get("max_position_embeddings", 4096))))
    g.add(f"{a}.embedding_length", V_UINT32, cfg["hidden_size"])
    g.add(f"{a}.feed_forward_length", V_UINT32, cfg["intermediate_size"])
    g.add(f"{a}.attention.head_count", V_UINT32, cfg["num_attention_heads"])
    g.add(f"{a}.attention.head_count_kv", V_ARRAY, (V_INT32, [1 if i + 1 in full_attn else 0 for i in range(n_layers)]))
    g.add(f"{a}.attention.layer_norm_rms_epsilon", V_FLOAT32, cfg["rms_norm_eps"])
    g.add(f"{a}.expert_count", V_UINT32, cfg["num_experts"])
    g.add(f"{a}.expert_used_count", V_UINT32, cfg["num_experts_per_token"])
    if cfg.get("moe_router_activation_func", "sigmoid") != "sigmoid":
        sys.exit("only sigmoid routers are converted")
    g.add(f"{a}.expert_gating_func", V_UINT32, 2)
    g.add(f"{a}.vocab_size", V_UINT32, cfg["vocab_size"])
    g.add(f"{a}.ssm.conv_kernel", V_UINT32, la["short_conv_kernel_size"])
    g.add(f"{a}.kda.head_dim", V_UINT32, la["head_dim"])
    if cfg.get("q_lora_rank"):
        g.add(f"{a}.attention.q_lora_rank", V_UINT32, cfg["q_lora_rank"])
    g.add(f"{a}.attention.kv_lora_rank", V_UINT32, cfg["kv_lora_rank"])
    g.add(f"{a}.rope.dimension_count", V_UINT32, cfg["qk_rope_head_dim"])
    g.add(f"{a}.attention.key_length", V_UINT32, cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"])
    g.add(f"{a}.attention.key_length_mla", V_UINT32, cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"])
    g.add(f"{a}.attention.value_length_mla", V_UINT32, cfg["v_head_dim"])
    g.add(f"{a}.expert_feed_forward_length", V_UINT32, cfg["moe_intermediate_size"])
    g.add(f"{a}.expert_shared_count", V_UINT32, cfg["num_shared_experts"])
    g.add(f"{a}.leading_dense_block_count", V_UINT32, cfg["first_k_dense_replace"])
    g.add(f"{a}.expert_weights_scale", V_FLOAT32, cfg["routed_scaling_factor"])
    g.add(f"{a}.expert_weights_norm", V_BOOL, bool(cfg.get("moe_renormalize", True)))
    g.add("general.file_type", V_UINT32, FTYPE_MOSTLY_MXFP4_MOE if experts_dtype == "mxfp4" else FTYPE_MOSTLY_BF16)


def add_vocab(g, cfg):
    n = cfg["vocab_size"]
    bos, eos = cfg.get("bos_token_id"), cfg.get("eos_token_id")
    tokens, types = [], []
    for i in range(n):
        if i < 256:
            tokens.append(byte_token(i))
            types.append(TOK_NORMAL)
        elif i in (bos, eos):
            tokens.append(f"<|special_{i}|>")
            types.append(TOK_CONTROL)
        else:   # printable, so llama.cpp's output names the ids it generated (checked against Deltafin's)
            tokens.append(f"[PAD{i}]")
            types.append(TOK_NORMAL)
    g.add("tokenizer.ggml.model", V_STRING, "gpt2")
    g.add("tokenizer.ggml.pre", V_STRING, "kimi-k2")
    g.add("tokenizer.ggml.tokens", V_ARRAY, (V_STRING, tokens))
    g.add("tokenizer.ggml.token_type", V_ARRAY, (V_INT32, types))
    g.add("tokenizer.ggml.merges", V_ARRAY, (V_STRING, []))
    if bos is not None:
        g.add("tokenizer.ggml.bos_token_id", V_UINT32, bos)
    if eos is not None:
        g.add("tokenizer.ggml.eos_token_id", V_UINT32, eos)
    g.add("tokenizer.ggml.add_bos_token", V_BOOL, False)


LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.q_conv1d.weight": "ssm_conv1d_q.weight",
    "self_attn.k_conv1d.weight": "ssm_conv1d_k.weight",
    "self_attn.v_conv1d.weight": "ssm_conv1d_v.weight",
    "self_attn.f_a_proj.weight": "ssm_f_a.weight",
    "self_attn.f_b_proj.weight": "ssm_f_b.weight",
    "self_attn.b_proj.weight": "ssm_beta.weight",
    "self_attn.A_log": "ssm_a",
    "self_attn.dt_bias": "ssm_dt.bias",
    "self_attn.g_a_proj.weight": "ssm_g_a.weight",
    "self_attn.g_b_proj.weight": "ssm_g_b.weight",
    "self_attn.o_norm.weight": "ssm_norm.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_a_proj.weight": "attn_q_a.weight",
    "self_attn.q_a_layernorm.weight": "attn_q_a_norm.weight",
    "self_attn.q_b_proj.weight": "attn_q_b.weight",
    "self_attn.kv_a_proj_with_mqa.weight": "attn_kv_a_mqa.weight",
    "self_attn.kv_a_layernorm.weight": "attn_kv_a_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "block_sparse_moe.gate.weight": "ffn_gate_inp.weight",
    "block_sparse_moe.gate.e_score_correction_bias": "exp_probs_b.bias",
    "block_sparse_moe.shared_experts.gate_proj.weight": "ffn_gate_shexp.weight",
    "block_sparse_moe.shared_experts.up_proj.weight": "ffn_up_shexp.weight",
    "block_sparse_moe.shared_experts.down_proj.weight": "ffn_down_shexp.weight",
}
GLOBAL_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                "lm_head.weight": "output.weight"}
EXPERT_PARTS = (("w1", "ffn_gate_exps.weight"), ("w2", "ffn_down_exps.weight"), ("w3", "ffn_up_exps.weight"))


def copy_tensor(g, ck, src, dst, shape=None):
    """Matrices keep their dtype; vectors become F32, as llama.cpp's converter writes them (its CPU
    element-wise ops take no BF16 operand)."""
    _, dtype, sh, _, nbytes = ck.tensors[src]
    gtype = ST_TYPES[dtype][0]
    if gtype is None:
        sys.exit(f"{src}: dtype {dtype} cannot be copied")
    if len(sh) == 1 and dtype == "BF16":
        g.add_tensor(dst, sh, GGML_F32, nbytes * 2, lambda: [f32_bytes(bf16_to_f32(ck.read(src)))])
        return
    g.add_tensor(dst, shape or sh, gtype, nbytes, lambda: [ck.read(src)])


def add_layer(g, ck, cfg, i, n_experts):
    pre = f"model.layers.{i}."
    for name in sorted(n for n in ck.tensors if n.startswith(pre) and ".experts." not in n):
        suffix = name[len(pre):]
        dst = f"blk.{i}."
        _, dtype, shape, _, nbytes = ck.tensors[name]
        if suffix.endswith("_conv1d.weight"):
            copy_tensor(g, ck, name, dst + LAYER_NAMES[suffix], [1, shape[0], 1, shape[-1]])
        elif suffix == "self_attn.A_log":
            heads = math.prod(shape)
            data = f32_bytes([-math.exp(v) for v in as_f32(ck.read(name), dtype)])
            g.add_tensor(dst + "ssm_a", [1, 1, heads, 1], GGML_F32, 4 * heads, lambda d=data: [d])
        elif suffix == "self_attn.kv_b_proj.weight":
            H, nope, vdim, kvl = (cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["v_head_dim"],
                                  cfg["kv_lora_rank"])
            elem = ST_TYPES[dtype][1]
            kb, vb = split_kv_b(ck.read(name), elem, H, nope, vdim, kvl)
            gtype = ST_TYPES[dtype][0]
            g.add_tensor(dst + "attn_k_b.weight", [H, kvl, nope], gtype, len(kb), lambda d=kb: [d])
            g.add_tensor(dst + "attn_v_b.weight", [H, vdim, kvl], gtype, len(vb), lambda d=vb: [d])
        elif suffix in LAYER_NAMES:
            copy_tensor(g, ck, name, dst + LAYER_NAMES[suffix])
        else:
            sys.exit(f"{name}: no llama.cpp Kimi-Linear tensor for it")
    if n_experts == 0 or f"{pre}block_sparse_moe.gate.weight" not in ck.tensors:
        return None
    first = f"{pre}block_sparse_moe.experts.0."
    mx = first + "w1.weight_packed" in ck.tensors
    for w, gname in EXPERT_PARTS:
        if mx:
            _, _, ps, _, pbytes = ck.tensors[f"{first}{w}.weight_packed"]
            rows, cols = ps[0], ps[1] * 2

            def produce(w=w):
                for e in range(n_experts):
                    b = f"{pre}block_sparse_moe.experts.{e}.{w}."
                    yield repack_mxfp4(ck.read(b + "weight_packed"), ck.read(b + "weight_scale"))
            g.add_tensor(f"blk.{i}.{gname}", [n_experts, rows, cols], GGML_MXFP4, n_experts * rows * cols // 32 * 17,
                         produce)
        else:
            _, dtype, sh, _, nbytes = ck.tensors[f"{first}{w}.weight"]

            def produce(w=w):
                for e in range(n_experts):
                    yield ck.read(f"{pre}block_sparse_moe.experts.{e}.{w}.weight")
            g.add_tensor(f"blk.{i}.{gname}", [n_experts] + sh, ST_TYPES[dtype][0], n_experts * nbytes, produce)
    return "mxfp4" if mx else "bf16"


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    folder, out = sys.argv[1], sys.argv[2]
    with open(os.path.join(folder, "config.json")) as f:
        cfg = json.load(f)
    if cfg.get("model_type") != "kimi_linear":
        sys.exit(f"{folder}: model_type {cfg.get('model_type')!r}; this tool converts Kimi-Linear checkpoints")
    ck = Checkpoint(folder)
    ck.strip_prefix()
    n_layers = cfg["num_hidden_layers"]
    full_attn = set(cfg["linear_attn_config"]["full_attn_layers"])
    g = Gguf()
    for src, dst in GLOBAL_NAMES.items():
        copy_tensor(g, ck, src, dst)
    experts_dtype = "bf16"
    for i in range(n_layers):
        experts_dtype = add_layer(g, ck, cfg, i, cfg["num_experts"]) or experts_dtype
    add_metadata(g, cfg, "kimi-linear", n_layers, full_attn, experts_dtype)
    add_vocab(g, cfg)
    g.write(out)


if __name__ == "__main__":
    main()
