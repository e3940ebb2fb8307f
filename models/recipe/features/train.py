"""The bundled features model: gradient-boosted trees over a card transaction's behaviour features.

Recipe (models/recipe/features/README.md): simulate transactions with PyPI `synccfd` (a synthetic
card-transaction and fraud simulator after Le Borgne et al., "Reproducible Machine Learning for
Credit Card Fraud Detection - Practical Handbook", 2022), compute the handbook's baseline features
plus two distances, train XGBoost on the first days, fit a temperature on the next, measure on the
last, and write models/features/:

  model.onnx        ai.onnx.ml TreeEnsembleRegressor: float features [N, F] -> margin [N, 1]
                    (log-odds; written from the booster's trees, post_transform NONE)
  trees.json        the same trees with each node's cover (training hessian sum), for exact
                    TreeSHAP in tiergate (`src/features/shap.rs`)
  schema.toml       the feature schema: names, types, units, missing values, required
  calibration.json  temperature T: risk = sigmoid(margin / T)
  manifest.json     names, sha256 of every file, the metrics below
  MODEL_CARD.md     what the data is and what the numbers mean
and tests/data/features_reference.json: rows of the test split with XGBoost's own SHAP values
(`pred_contribs`), which tiergate's TreeSHAP must reproduce; tests/data/features_validation.csv:
300 labelled rows of the calibration split, what `tiergate features-model pack` is tested with.

    python3 models/recipe/features/train.py [--customers 2000] [--days 90] [--out models/features]
"""

import argparse
import hashlib
import json
import math
import pathlib
import sys
import time

import numpy as np
import onnx
import onnxruntime as ort
import pandas as pd
import xgboost as xgb
from onnx import TensorProto, helper

ROOT = pathlib.Path(__file__).resolve().parents[3]

# (name, kind, unit, required, description). Order = the model's input order.
FEATURES = [
    ("amount", "number", "currency units", True, "the transaction's amount"),
    ("card_not_present", "bool", "", True, "card-not-present (online, phone) rather than at a terminal"),
    ("is_night", "bool", "", True, "made between 00:00 and 06:00 local time"),
    ("is_weekend", "bool", "", True, "made on a Saturday or Sunday"),
    ("customer_tx_1d", "number", "transactions", False, "the customer's transactions in the last day, this one included"),
    ("customer_tx_7d", "number", "transactions", False, "... in the last 7 days"),
    ("customer_tx_30d", "number", "transactions", False, "... in the last 30 days"),
    ("customer_avg_amount_1d", "number", "currency units", False, "the customer's mean amount over the last day"),
    ("customer_avg_amount_7d", "number", "currency units", False, "... over the last 7 days"),
    ("customer_avg_amount_30d", "number", "currency units", False, "... over the last 30 days"),
    ("terminal_tx_1d", "number", "transactions", False, "the terminal's transactions in the day that ended 7 days ago"),
    ("terminal_tx_7d", "number", "transactions", False, "... in the 7 days that ended 7 days ago"),
    ("terminal_tx_30d", "number", "transactions", False, "... in the 30 days that ended 7 days ago"),
    ("terminal_risk_1d", "number", "share", False, "share of the terminal's known frauds in the day that ended 7 days ago"),
    ("terminal_risk_7d", "number", "share", False, "... in the 7 days that ended 7 days ago"),
    ("terminal_risk_30d", "number", "share", False, "... in the 30 days that ended 7 days ago"),
    ("billing_terminal_km", "number", "km", False, "distance between the billing address and the terminal"),
    ("billing_shipping_km", "number", "km", False, "distance between the billing and the shipping address"),
]
NAMES = [f[0] for f in FEATURES]
DELAY_DAYS = 7  # fraud labels arrive late: terminal risk uses only windows that ended this long ago


def log(msg):
    print(f"[features {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def haversine_km(lat1, lon1, lat2, lon2):
    lat1, lon1, lat2, lon2 = (np.radians(v) for v in (lat1, lon1, lat2, lon2))
    a = np.sin((lat2 - lat1) / 2) ** 2 + np.cos(lat1) * np.cos(lat2) * np.sin((lon2 - lon1) / 2) ** 2
    return 6371.0 * 2 * np.arcsin(np.sqrt(a))


def customer_windows(tx):
    """The handbook's customer features: count and mean amount over 1, 7, 30 days, this transaction included."""
    out = []
    for _, g in tx.groupby("CUSTOMER_ID", sort=False):
        g = g.sort_values("TX_DATETIME").set_index("TX_DATETIME")
        cols = {}
        for d in (1, 7, 30):
            n = g["TX_AMOUNT"].rolling(f"{d}D").count()
            s = g["TX_AMOUNT"].rolling(f"{d}D").sum()
            cols[f"customer_tx_{d}d"] = n.values
            cols[f"customer_avg_amount_{d}d"] = (s / n).values
        out.append(pd.DataFrame(cols, index=g["TRANSACTION_ID"].values))
    return pd.concat(out)


def terminal_windows(tx):
    """The handbook's terminal features: transactions and fraud share over 1, 7, 30 days, delayed 7 days."""
    out = []
    for _, g in tx.groupby("TERMINAL_ID", sort=False):
        g = g.sort_values("TX_DATETIME").set_index("TX_DATETIME")
        fraud, ones = g["TX_FRAUD"], g["TX_FRAUD"] * 0 + 1
        n_delay = ones.rolling(f"{DELAY_DAYS}D").sum()
        f_delay = fraud.rolling(f"{DELAY_DAYS}D").sum()
        cols = {}
        for d in (1, 7, 30):
            n = ones.rolling(f"{d + DELAY_DAYS}D").sum() - n_delay
            f = fraud.rolling(f"{d + DELAY_DAYS}D").sum() - f_delay
            cols[f"terminal_tx_{d}d"] = n.values
            cols[f"terminal_risk_{d}d"] = np.where(n > 0, f / n.where(n > 0, 1), 0.0)
        out.append(pd.DataFrame(cols, index=g["TRANSACTION_ID"].values))
    return pd.concat(out)


def simulate(customers, days, seed):
    from synccfd import DatasetGenerator

    gen = DatasetGenerator(n_customers=customers, n_terminals=customers * 2, nb_days=days, random_state=seed)
    _, _, tx = gen.generate()
    tx = tx.sort_values("TX_DATETIME").reset_index(drop=True)
    tx["TX_DATETIME"] = pd.to_datetime(tx["TX_DATETIME"])
    feats = pd.DataFrame(index=tx["TRANSACTION_ID"].values)
    feats["amount"] = tx["TX_AMOUNT"].values
    feats["card_not_present"] = (tx["TX_TYPE"] == "CNP").astype(float).values
    feats["is_night"] = (tx["TX_DATETIME"].dt.hour < 6).astype(float).values
    feats["is_weekend"] = (tx["TX_DATETIME"].dt.day_of_week >= 5).astype(float).values
    feats = feats.join(customer_windows(tx)).join(terminal_windows(tx))
    feats["billing_terminal_km"] = haversine_km(tx.TX_BILL_LAT, tx.TX_BILL_LONG, tx.TX_TERM_LAT, tx.TX_TERM_LONG).values
    feats["billing_shipping_km"] = haversine_km(tx.TX_BILL_LAT, tx.TX_BILL_LONG, tx.TX_SHIPP_LAT, tx.TX_SHIPP_LONG).values
    feats = feats[NAMES].astype(np.float32)
    feats["label"] = tx["TX_FRAUD"].values
    feats["day"] = tx["TX_TIME_DAYS"].values
    feats["scenario"] = tx["TX_FRAUD_SCENARIO"].values
    return feats


def tree_nodes(booster):
    """Each tree's nodes as tiergate's TreeSHAP reads them (node i at index i)."""
    df = booster.trees_to_dataframe()
    trees = []
    for t, g in df.groupby("Tree", sort=True):
        g = g.sort_values("Node")
        assert list(g["Node"]) == list(range(len(g))), "nodes are numbered 0..n"
        nodes = []
        for r in g.itertuples():
            if r.Feature == "Leaf":
                nodes.append({"leaf": float(r.Gain), "cover": float(r.Cover)})
            else:
                ref = lambda s: int(str(s).split("-")[1])  # "tree-node"
                nodes.append({
                    "feature": NAMES.index(r.Feature),
                    "threshold": float(np.float32(r.Split)),
                    "yes": ref(r.Yes), "no": ref(r.No), "missing": ref(r.Missing),
                    "cover": float(r.Cover),
                })
        trees.append(nodes)
    return trees


def margin_of(trees, base, x):
    total = base
    for nodes in trees:
        i = 0
        while "leaf" not in nodes[i]:
            n = nodes[i]
            i = n["yes"] if x[n["feature"]] < n["threshold"] else n["no"]
        total += nodes[i]["leaf"]
    return total


def to_onnx(trees, base):
    """TreeEnsembleRegressor (ai.onnx.ml 3): x < threshold takes the `yes` branch, as XGBoost."""
    a = {k: [] for k in ("tid", "nid", "fid", "val", "mode", "t", "f", "miss")}
    tt, tn, tw = [], [], []
    for t, nodes in enumerate(trees):
        for i, n in enumerate(nodes):
            a["tid"].append(t); a["nid"].append(i)
            if "leaf" in n:
                a["fid"].append(0); a["val"].append(0.0); a["mode"].append("LEAF")
                a["t"].append(0); a["f"].append(0); a["miss"].append(0)
                tt.append(t); tn.append(i); tw.append(n["leaf"])
            else:
                a["fid"].append(n["feature"]); a["val"].append(n["threshold"]); a["mode"].append("BRANCH_LT")
                a["t"].append(n["yes"]); a["f"].append(n["no"]); a["miss"].append(int(n["missing"] == n["yes"]))
    node = helper.make_node(
        "TreeEnsembleRegressor", ["features"], ["margin"], domain="ai.onnx.ml",
        n_targets=1, aggregate_function="SUM", post_transform="NONE", base_values=[base],
        nodes_treeids=a["tid"], nodes_nodeids=a["nid"], nodes_featureids=a["fid"], nodes_values=a["val"],
        nodes_modes=a["mode"], nodes_truenodeids=a["t"], nodes_falsenodeids=a["f"],
        nodes_missing_value_tracks_true=a["miss"],
        target_treeids=tt, target_nodeids=tn, target_ids=[0] * len(tt), target_weights=tw,
    )
    graph = helper.make_graph(
        [node], "tiergate-features",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, [None, len(NAMES)])],
        [helper.make_tensor_value_info("margin", TensorProto.FLOAT, [None, 1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    return model


def sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def fit_temperature(margin, y):
    """Temperature scaling (Guo et al., 2017) for one logit: T minimising the NLL, by golden section."""
    def nll(t):
        p = np.clip(sigmoid(margin / t), 1e-7, 1 - 1e-7)
        return -np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))
    lo, hi = 0.05, 20.0
    g = (math.sqrt(5) - 1) / 2
    for _ in range(80):
        a, b = hi - g * (hi - lo), lo + g * (hi - lo)
        lo, hi = (lo, b) if nll(a) < nll(b) else (a, hi)
    return (lo + hi) / 2


def ece(p, y, bins=15):
    """Expected calibration error over equal-width bins of the risk probability."""
    idx = np.minimum((p * bins).astype(int), bins - 1)
    total = 0.0
    for b in range(bins):
        m = idx == b
        if m.any():
            total += m.mean() * abs(p[m].mean() - y[m].mean())
    return float(total)


def metrics(p, y):
    from sklearn.metrics import average_precision_score, roc_auc_score

    order = np.argsort(-p)
    top = order[: max(1, int(0.01 * len(p)))]
    return {
        "n": int(len(y)), "frauds": int(y.sum()),
        "auc": round(float(roc_auc_score(y, p)), 4),
        "average_precision": round(float(average_precision_score(y, p)), 4),
        "precision_at_top_1pct": round(float(y[top].mean()), 4),
        "ece": round(ece(p, y), 4),
    }


def at_thresholds(p, y, review_at=0.5, block_at=0.9):
    """What the bundled policy's [features_model] thresholds do on a split: share of rows, precision, recall."""
    out = {}
    for name, t in (("review_or_block", review_at), ("block", block_at)):
        m = p >= t
        out[name] = {"at": t, "share": round(float(m.mean()), 4),
                     "precision": round(float(y[m].mean()) if m.any() else 0.0, 4),
                     "recall": round(float(m[y == 1].mean()), 4)}
    return out


def sha256(path):
    return hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--customers", type=int, default=2000)
    ap.add_argument("--days", type=int, default=90)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--trees", type=int, default=120)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--out", default=str(ROOT / "models/features"))
    ap.add_argument("--reference", default=str(ROOT / "tests/data/features_reference.json"))
    ap.add_argument("--validation-sample", default=str(ROOT / "tests/data/features_validation.csv"))
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    log(f"simulating {args.customers} customers over {args.days} days (synccfd)")
    data = simulate(args.customers, args.days, args.seed)
    # Time split with gaps, so windows and delayed terminal risk never read the next split's labels.
    first = data["day"] >= 30  # every 30-day window full
    train = data[first & (data["day"] < 60)]
    calib = data[(data["day"] >= 60 + DELAY_DAYS) & (data["day"] < 74)]
    test = data[data["day"] >= 74 + DELAY_DAYS]
    log(f"train {len(train)} ({int(train.label.sum())} frauds), calibration {len(calib)}, test {len(test)}")

    dtrain = xgb.DMatrix(train[NAMES].values, label=train["label"].values, feature_names=NAMES)
    params = {"objective": "binary:logistic", "max_depth": args.depth, "eta": 0.1, "subsample": 0.8,
              "colsample_bytree": 0.8, "min_child_weight": 5, "eval_metric": "aucpr", "seed": args.seed,
              "nthread": 2, "tree_method": "hist"}
    booster = xgb.train(params, dtrain, num_boost_round=args.trees)

    trees = tree_nodes(booster)
    x_cal = calib[NAMES].values
    xgb_margin = booster.predict(xgb.DMatrix(x_cal, feature_names=NAMES), output_margin=True)
    leaves = np.array([margin_of(trees, 0.0, r) for r in x_cal[:200]])
    base = float(np.median(xgb_margin[:200] - leaves))
    assert np.max(np.abs(xgb_margin[:200] - leaves - base)) < 1e-4, "trees_to_dataframe reproduces the booster"

    model = to_onnx(trees, base)
    onnx.save(model, out / "model.onnx")
    session = ort.InferenceSession(str(out / "model.onnx"))
    onnx_margin = lambda x: session.run(None, {"features": x.astype(np.float32)})[0][:, 0]
    diff = np.max(np.abs(onnx_margin(x_cal) - xgb_margin))
    log(f"ONNX margin vs XGBoost: max |diff| {diff:.2e}")
    assert diff < 1e-4

    t = fit_temperature(onnx_margin(x_cal).astype(np.float64), calib["label"].values)
    y_test = test["label"].values
    m_test = onnx_margin(test[NAMES].values).astype(np.float64)
    raw, cal = metrics(sigmoid(m_test), y_test), metrics(sigmoid(m_test / t), y_test)
    log(f"temperature {t:.4f}; test: {json.dumps(cal)} (uncalibrated ECE {raw['ece']})")

    medians = train[NAMES].median()
    with open(out / "schema.toml", "w") as f:
        f.write("# The features model's input, in the model's order (models/recipe/features/train.py).\n")
        f.write("# kind: number | bool (true/false, or 0/1); missing: the value used when an optional\n")
        f.write("# feature is absent (its median over the training split); normalize: none (trees split on raw values).\n")
        for name, kind, unit, required, desc in FEATURES:
            f.write(f"\n[[feature]]\nname = \"{name}\"\nkind = \"{kind}\"\nunit = \"{unit}\"\n")
            f.write(f"required = {'true' if required else 'false'}\n")
            if not required:
                f.write(f"missing = {float(medians[name]):.6g}\n")
            f.write(f"description = \"{desc}\"\n")
    (out / "trees.json").write_text(json.dumps({"base_margin": base, "features": NAMES, "trees": trees},
                                               separators=(",", ":")))
    (out / "calibration.json").write_text(json.dumps(
        {"method": "temperature", "temperature": round(t, 6), "fitted_on": f"days {60 + DELAY_DAYS}-73",
         "n": int(len(calib)), "ece_before": metrics(sigmoid(onnx_margin(x_cal)), calib["label"].values)["ece"],
         "ece_after": metrics(sigmoid(onnx_margin(x_cal) / t), calib["label"].values)["ece"]}, indent=2) + "\n")

    # Reference SHAP values from XGBoost itself, on test rows (frauds and not), for tiergate's test.
    pick = np.concatenate([np.where(y_test == 1)[0][:10], np.where(y_test == 0)[0][:10]])
    rows = test[NAMES].values[pick]
    contribs = booster.predict(xgb.DMatrix(rows, feature_names=NAMES), pred_contribs=True)
    ref = []
    for r, c, y in zip(rows, contribs, y_test[pick]):
        ref.append({"features": {n: float(v) for n, v in zip(NAMES, r)}, "label": int(y),
                    "margin": float(onnx_margin(r[None, :])[0]), "shap": [float(v) for v in c[:-1]],
                    "bias": float(c[-1])})
    pathlib.Path(args.reference).write_text(json.dumps(
        {"source": "XGBoost pred_contribs (exact TreeSHAP) on models/features", "rows": ref}, indent=1) + "\n")

    frauds = calib[calib["label"] == 1].head(60)
    sample = pd.concat([frauds, calib[calib["label"] == 0].sample(300 - len(frauds), random_state=args.seed)])
    sample[NAMES + ["label"]].to_csv(args.validation_sample, index=False, float_format="%.6g")

    manifest = {
        "name": "risk-features-xgb-synccfd", "kind": "tree_ensemble", "input": "features", "output": "margin",
        "trees": len(trees), "max_depth": args.depth, "features": len(NAMES),
        "data": {"simulator": "synccfd 0.1.0", "customers": args.customers, "days": args.days, "seed": args.seed,
                 "train": int(len(train)), "calibration": int(len(calib)), "test": int(len(test))},
        "test": cal, "test_uncalibrated_ece": raw["ece"],
        "test_at_policy_thresholds": at_thresholds(sigmoid(m_test / t), y_test),
        "sha256": {p: sha256(out / p) for p in ("model.onnx", "trees.json", "schema.toml", "calibration.json")},
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    log(f"wrote {out}")


if __name__ == "__main__":
    main()
