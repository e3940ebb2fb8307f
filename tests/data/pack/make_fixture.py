"""Makes the tiny classifier `tiergate model pack` is tested with (tests/model_pack.rs): no training,
a few KB, committed with this script. Python 3.11 with `onnx` and `tokenizers` (models/recipe/ml_requirements.txt).

  python tests/data/pack/make_fixture.py tests/data/pack

Writes:
- classifier.onnx: input_ids, attention_mask (int64 [batch, sequence]) -> Gather of an 8-wide embedding table ->
  mask-weighted mean -> logits = pooled @ W + b ([batch, 2], ok then risk) and embedding = pooled / |pooled|
  ([batch, 8]). Words of scams carry weight on the risk logit, words of ordinary chat on the ok logit.
- with_token_type_ids.onnx: the same graph with a third input, token_type_ids (what many exports have and tiergate
  refuses with a message).
- classifier_static_int8.onnx / classifier_dynamic_int8.onnx: classifier.onnx quantised by onnxruntime's
  quantize_static (QDQ, QUInt8 activations with MinMax ranges from the validation texts, QInt8 weights) and
  quantize_dynamic (activation scales computed per call over the whole batch): a score alone and inside a batch are
  the same for the first and move with batch-mates for the second (tests/batching.rs). Needs `onnxruntime` too.
- tokenizer.json: WordLevel over the fixture's words, lower-cased, [CLS] ... [SEP].
- validation.jsonl: 60 labelled rows made from the same words (label 0/1 and class names mixed; one in ten
  labelled against its words, as real validation sets have errors, so the temperature fit stays finite).
"""
import json, os, random, sys
import numpy as np, onnx
from onnx import TensorProto, helper, numpy_helper
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
RISK = ["urgent", "password", "gift", "card", "transfer", "verify", "account", "suspended", "wire", "prize", "code", "now"]
OK = ["lunch", "meeting", "tomorrow", "thanks", "photos", "weekend", "dinner", "report", "see", "you", "at", "the"]
vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]"] + RISK + OK)}
D = 8
rng = np.random.default_rng(7)
E = rng.normal(0, 0.1, (len(vocab), D)).astype(np.float32)
for w in RISK: E[vocab[w], 0] += 1.0
for w in OK: E[vocab[w], 1] += 1.0
W = np.zeros((D, 2), np.float32); W[0, 1] = 4.0; W[1, 0] = 4.0
b = np.zeros(2, np.float32)

def graph(extra_input):
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"]),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "sequence"])]
    if extra_input:
        inputs.append(helper.make_tensor_value_info("token_type_ids", TensorProto.INT64, ["batch", "sequence"]))
    nodes = [
        helper.make_node("Gather", ["E", "input_ids"], ["x"]),
        helper.make_node("Cast", ["attention_mask"], ["m"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["m", "axis2"], ["m3"]),
        helper.make_node("Mul", ["x", "m3"], ["xm"]),
        helper.make_node("ReduceSum", ["xm", "axis1"], ["s"], keepdims=0),
        helper.make_node("ReduceSum", ["m3", "axis1"], ["n"], keepdims=0),
        helper.make_node("Max", ["n", "one"], ["n1"]),
        helper.make_node("Div", ["s", "n1"], ["pooled"]),
        helper.make_node("MatMul", ["pooled", "W"], ["z"]),
        helper.make_node("Add", ["z", "b"], ["logits"]),
        helper.make_node("LpNormalization", ["pooled"], ["embedding"], axis=-1, p=2),
    ]
    inits = [numpy_helper.from_array(E, "E"), numpy_helper.from_array(W, "W"), numpy_helper.from_array(b, "b"),
             numpy_helper.from_array(np.array([2], np.int64), "axis2"), numpy_helper.from_array(np.array([1], np.int64), "axis1"),
             numpy_helper.from_array(np.array([1.0], np.float32), "one")]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 2]),
               helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["batch", D])]
    g = helper.make_graph(nodes, "tiny_classifier", inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], producer_name="tiergate-fixture")
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m

onnx.save(graph(False), os.path.join(out, "classifier.onnx"))
onnx.save(graph(True), os.path.join(out, "with_token_type_ids.onnx"))

tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
tok.normalizer = normalizers.Lowercase()
tok.pre_tokenizer = pre_tokenizers.Whitespace()
tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
                                                   special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
tok.save(os.path.join(out, "tokenizer.json"))

r = random.Random(11)
with open(os.path.join(out, "validation.jsonl"), "w") as f:
    for i in range(60):
        risky = i % 2 == 1
        words = r.sample(RISK if risky else OK, 3) + r.sample(OK if risky else RISK, 2)   # two words of the other kind
        truth = risky != (i % 10 == 4)              # one row in ten labelled against its words: the fit stays finite
        label = int(truth) if i % 3 else ("risk" if truth else "ok")
        f.write(json.dumps({"text": " ".join(words).capitalize() + ".", "label": label}) + "\n")
print("wrote", sorted(os.listdir(out)))

# Quantised copies (after the tokenizer and validation set: calibration reads them).
from onnxruntime.quantization import (CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType, quantize_dynamic,
                                      quantize_static)

class Texts(CalibrationDataReader):
    def __init__(self):
        rows = [json.loads(l)["text"] for l in open(os.path.join(out, "validation.jsonl"))]
        self.it = iter([{"input_ids": np.array([e.ids], np.int64), "attention_mask": np.array([e.attention_mask], np.int64)}
                        for e in tok.encode_batch(rows)])
    def get_next(self):
        return next(self.it, None)

src = os.path.join(out, "classifier.onnx")
quantize_static(src, os.path.join(out, "classifier_static_int8.onnx"), Texts(), quant_format=QuantFormat.QDQ,
                activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, calibrate_method=CalibrationMethod.MinMax,
                op_types_to_quantize=["MatMul"])
quantize_dynamic(src, os.path.join(out, "classifier_dynamic_int8.onnx"), weight_type=QuantType.QInt8,
                 op_types_to_quantize=["MatMul"])
