"""HF reference logits for the Kimi-Linear fixtures: transformers 5.17 KimiLinearForCausalLM, float32, CPU.

Needs torch + transformers (5.17) + numpy; fla must NOT be installed (it would replace the pure PyTorch path).
For each fixture folder (config.json, model.safetensors, prompt.json) it writes
  logits.f32       prefill rows (one call, use_cache=True) then one row per decode token (cached single steps)
  hf_report.json   versions, load method, HF self-consistency numbers, router choices, naming check
Weights are loaded with HF's own loader (`from_pretrained`, which applies its checkpoint->module renaming):
directly from the fixture folder, or, for MXFP4 experts (HF 5.17 has no compressed-tensors MXFP4 path), from a
temporary copy where every expert is replaced by its exact fp32 dequantisation.

Usage: python3 tools/hf_ref.py FIXTURE_ROOT NAME [NAME ...]   (diagnostics go to $OUT/hf_diag.txt if OUT is set)"""
import importlib.util
import inspect
import json
import os
import shutil
import sys
import tempfile
import traceback

import numpy as np
import torch
import transformers
from safetensors.numpy import save_file
from transformers import KimiLinearConfig, KimiLinearForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from st_io import mxfp4_dequant, read_header, read_safetensors  # noqa: E402

DIAG = []


def diag(*a):
    s = " ".join(str(x) for x in a)
    print(s)
    DIAG.append(s)


def fixture_tensors(d):
    """Checkpoint tensors as exact float32 numpy (BF16 widened, MXFP4 dequantised to `.weight`)."""
    w = read_safetensors(os.path.join(d, "model.safetensors"))
    for k in [k for k in w if k.endswith(".weight_packed")]:
        base = k[:-len("_packed")]
        w[base] = mxfp4_dequant(w.pop(k), w.pop(base + "_scale"))
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in w.items()}


def plain_config_dir(d, work):
    cfg = json.load(open(os.path.join(d, "config.json")))
    cfg.pop("quantization_config", None)
    cfg["dtype"] = "float32"
    os.makedirs(work, exist_ok=True)
    with open(os.path.join(work, "config.json"), "w") as f:
        json.dump(cfg, f)
    return cfg


def saved_layout(model, work, dtype=None):
    """name -> (dtype, shape) exactly as save_pretrained writes it."""
    out = os.path.join(work, "saved")
    shutil.rmtree(out, ignore_errors=True)
    (model.to(dtype) if dtype else model).save_pretrained(out)
    lay = {}
    for f in sorted(os.listdir(out)):
        if f.endswith(".safetensors"):
            for k, v in read_header(os.path.join(out, f)).items():
                if k != "__metadata__":
                    lay[k] = (v["dtype"], v["shape"])
    return lay, out


def load(src):
    model, info = KimiLinearForCausalLM.from_pretrained(src, dtype=torch.float32, attn_implementation="eager",
                                                        output_loading_info=True)
    bad = {k: list(v) for k, v in info.items() if v}
    return model.eval(), bad


def run(model, prefill, decode, capture=False):
    picks, hooks = [], []
    if capture:
        for name, mod in model.named_modules():
            if type(mod).__name__.endswith("TopkRouter"):
                def hook(m, inp, out, name=name):
                    outs = out if isinstance(out, tuple) else (out,)
                    for o in outs:
                        if torch.is_tensor(o) and not o.is_floating_point() and o.ndim == 2:
                            picks.append([sorted(map(int, r)) for r in o.tolist()])
                hooks.append(mod.register_forward_hook(hook))
    with torch.no_grad():
        o = model(torch.tensor([prefill]), use_cache=True)
        for h in hooks:
            h.remove()
        rows, cache = [o.logits[0].float()], o.past_key_values
        for t in decode:
            o = model(torch.tensor([[t]]), past_key_values=cache, use_cache=True)
            cache = o.past_key_values
            rows.append(o.logits[0, -1:].float())
        whole = model(torch.tensor([prefill + decode])).logits[0].float()
    rows = torch.cat(rows).numpy()
    return rows, float(np.abs(whole.numpy() - rows).max()), picks


def swap_dense(k):
    """The dense-FFN prefix HF writes (`block_sparse_moe.`) vs the one real checkpoints use (`mlp.`)."""
    return k.replace(".mlp.", ".block_sparse_moe.") if ".mlp." in k else k.replace(".block_sparse_moe.", ".mlp.")


def compare_names(fix, lay):
    fixn, hfn = set(fix), set(lay)
    only_f, only_h = sorted(fixn - hfn), sorted(hfn - fixn)
    shape = sorted(k for k in fixn & hfn if list(fix[k].shape) != list(lay[k][1]))
    if not (only_f or only_h or shape):
        return (f"All {len(fixn)} tensor names and shapes (after MXFP4 dequantisation: `weight_packed`/"
                "`weight_scale` -> `.weight`) equal what transformers' `save_pretrained` writes for this config."), []
    txt = ["Differences from what transformers' `save_pretrained` writes for this config:"]
    if only_f:
        txt.append(f"only in the fixture: {only_f}")
    if only_h:
        txt.append(f"only in save_pretrained: {only_h}")
    if shape:
        txt.append("shape differs: " + ", ".join(f"{k} fixture {list(fix[k].shape)} vs HF {lay[k][1]}" for k in shape))
    return " ".join(txt), shape


def write_report(path, report):
    """One key per line (the router lists stay on one line each)."""
    with open(path, "w") as f:
        f.write("{\n" + ",\n".join(f" {json.dumps(k)}: {json.dumps(v)}" for k, v in report.items()) + "\n}\n")


def one(root, name):
    d = os.path.join(root, name)
    work = tempfile.mkdtemp(prefix=f"hf_{name}_")
    plain_config_dir(d, work)
    config = KimiLinearConfig.from_pretrained(work)
    fresh = KimiLinearForCausalLM(config).eval()
    lay, _ = saved_layout(fresh, work)
    if name == "kl-fp32":
        diag("HF module state_dict:", {k: list(v.shape) for k, v in fresh.state_dict().items()})
        diag("save_pretrained layout:", lay)
        for n, m in fresh.named_modules():
            if type(m).__name__.endswith("TopkRouter"):
                diag("ROUTER SOURCE\n" + inspect.getsource(type(m).forward))
                break
        diag("experts implementation:", getattr(config, "_experts_implementation", None))
    if name == "kl-bf16":
        lay16, _ = saved_layout(KimiLinearForCausalLM(config), work, torch.bfloat16)
        diag("kl-bf16: save_pretrained of a bf16 model keeps these non-BF16:",
             {k: v for k, v in lay16.items() if v[0] != "BF16"})
    fix = fixture_tensors(d)
    names_txt, shape_diff = compare_names(fix, lay)
    diag(name, names_txt)
    quant = any(k.endswith("weight_packed") for k in read_header(os.path.join(d, "model.safetensors")))
    report = {"transformers": transformers.__version__, "torch": torch.__version__,
              "fla_installed": importlib.util.find_spec("fla") is not None, "device": "cpu",
              "names_vs_save_pretrained": names_txt, "problems": []}
    model, bad = (None, None)
    if not quant and not shape_diff:
        model, bad = load(d)
        report["load"] = "KimiLinearForCausalLM.from_pretrained(fixture_dir, dtype=torch.float32)"
        if bad:
            report["problems"].append(f"direct load: {bad}")
            model = None
    if model is None:                                       # exact fp32 copy (MXFP4 dequantised, shapes fixed)
        tens = {}
        for k, v in fix.items():
            if k not in lay and swap_dense(k) in lay:
                k = swap_dense(k)
            if k in lay and list(v.shape) != list(lay[k][1]) and v.size == int(np.prod(lay[k][1])):
                v = v.reshape(lay[k][1])
            tens[k] = np.ascontiguousarray(v)
        save_file(tens, os.path.join(work, "model.safetensors"), metadata={"format": "pt"})
        model, bad = load(work)
        report["load"] = ("KimiLinearForCausalLM.from_pretrained(copy with exact fp32 dequantised experts, "
                          "dtype=torch.float32)" if quant else
                          "KimiLinearForCausalLM.from_pretrained(fp32 copy with shapes matched to HF, dtype=float32)")
        if bad:
            report["problems"].append(f"copy load: {bad}")
            raise RuntimeError(f"{name}: HF could not load every tensor: {bad}")
    prompt = json.load(open(os.path.join(d, "prompt.json")))
    rows, batch_diff, picks = run(model, prompt["prefill"], prompt["decode"], capture=True)
    report["hf_batch_vs_rows"] = batch_diff
    report["router_topk"] = picks
    # values HF holds must be exactly the fixture's: save what it loaded and compare, then reload and rerun
    _, out = saved_layout(model, work)
    back = {}
    for f in os.listdir(out):
        if f.endswith(".safetensors"):
            back.update(read_safetensors(os.path.join(out, f)))
    back.update({swap_dense(k): v for k, v in back.items() if swap_dense(k) not in back})
    diffs = [float(np.abs(back[k].reshape(-1) - v.reshape(-1)).max()) for k, v in fix.items() if k in back]
    report["saved_values_vs_fixture"] = max(diffs) if diffs else None
    report["saved_names_missing"] = sorted(set(fix) - set(back))
    again, _ = load(out)
    rows2, _, _ = run(again, prompt["prefill"], prompt["decode"])
    report["hf_reload_vs_rows"] = float(np.abs(rows2 - rows).max())
    if name == "kl-grouped":
        report["grouped_note"] = ("Grouped routing reference: transformers 5.17's `KimiLinearTopkRouter` applies the "
                                  "DeepSeek group-limited selection (group score = sum of the top-2 biased scores, "
                                  "keep `topk_group` groups, mask the rest) -- checked by reading its source on the "
                                  "reference machine and by comparing its chosen experts with the NumPy reference "
                                  "below.")
    rows.astype("<f4").tofile(os.path.join(d, "logits.f32"))
    write_report(os.path.join(d, "hf_report.json"), report)
    diag(f"{name}: rows {rows.shape}, max|logit| {np.abs(rows).max():.4g}, batch-vs-rows {batch_diff:.3g}, "
         f"reload {report['hf_reload_vs_rows']:.3g}, saved-vs-fixture {report['saved_values_vs_fixture']}, "
         f"missing-after-save {report['saved_names_missing'][:6]}, problems {report['problems']}")
    shutil.rmtree(work, ignore_errors=True)


def main():
    torch.set_num_threads(min(8, os.cpu_count() or 1))
    root, names = sys.argv[1], sys.argv[2:]
    diag("transformers", transformers.__version__, "torch", torch.__version__,
         "fla", importlib.util.find_spec("fla") is not None)
    failed = []
    for n in names:
        try:
            one(root, n)
        except Exception:
            diag(f"{n}: FAILED\n{traceback.format_exc()}")
            failed.append(n)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "hf_diag.txt"), "w") as f:
            f.write("\n".join(DIAG) + "\n")
    if failed:
        sys.exit(f"failed: {failed}")


if __name__ == "__main__":
    main()
