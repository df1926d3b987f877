"""nmt.runtime on a real exported folder: the same translations as the PyTorch path, the command line, the
server and the Python API without torch, and one-line errors for what an ONNX folder cannot do."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nmt.config import ConfigError

from .conftest import read_gz
from .serve_process import REPO, Server

pytest.importorskip("onnxruntime", reason="the ONNX runtime's tests need onnxruntime (pip install 'nmt[onnx]')")

# Any `import torch` in a process started with this on its PYTHONPATH raises ImportError.
BLOCK_TORCH = '''import sys
class _NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError("No module named 'torch' (blocked in this test)", name="torch")
sys.meta_path.insert(0, _NoTorch())
'''


def export_onnx(model: Path, out: Path, *options: str) -> Path:
    result = subprocess.run([sys.executable, "-m", "nmt", "export", str(model), "-o", str(out), "--format", "onnx",
                             *options], capture_output=True, text=True, cwd=REPO)
    if result.returncode != 0 and "--format" in result.stderr:
        pytest.skip("this nmt has no `nmt export --format onnx`")
    assert result.returncode == 0, result.stderr
    return out


@pytest.fixture(scope="module")
def folder(model_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_onnx(model_file, tmp_path_factory.mktemp("onnx") / "model-onnx")


@pytest.fixture(scope="module")
def sources() -> list[str]:
    return read_gz("test_2016_flickr.de", 40)


@pytest.fixture(scope="module")
def no_torch_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    block = tmp_path_factory.mktemp("no-torch")
    (block / "sitecustomize.py").write_text(BLOCK_TORCH)
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(block), str(REPO)]), "OMP_NUM_THREADS": "1"}


@pytest.mark.parametrize("beam_size", [1, 5])
def test_float32_translations_equal_pytorch_line_for_line(model_file, folder, sources, beam_size):
    from nmt.decode.translator import Translator as TorchTranslator
    from nmt.runtime.translator import Translator as OnnxTranslator

    want = TorchTranslator.load(model_file, device="cpu", precision="fp32", shortlist=False)
    got = OnnxTranslator.load(folder, shortlist=False)
    expected, found = want.translate(sources, beam_size=beam_size), got.translate(sources, beam_size=beam_size)
    assert [t.text for t in found] == [t.text for t in expected]
    assert [t.score for t in found] == pytest.approx([t.score for t in expected], rel=1e-4, abs=1e-4)


def test_shortlist_translations_equal_pytorch(model_file, folder, sources):
    from nmt.decode.translator import Translator as TorchTranslator
    from nmt.runtime.translator import Translator as OnnxTranslator

    if json.loads((folder / "nmt-onnx.json").read_text())["shortlist"] is None:
        pytest.skip("the smoke model embeds no shortlist")
    got = OnnxTranslator.load(folder, shortlist=True, shortlist_k=5)           # a small one: many pieces cut
    want = TorchTranslator.load(model_file, device="cpu", precision="fp32", shortlist=True, shortlist_k=5)
    for beam_size in (1, 5):
        expected = want.translate(sources, beam_size=beam_size, prefixes=["A"] * len(sources))
        found = got.translate(sources, beam_size=beam_size, prefixes=["A"] * len(sources))
        assert [t.text for t in found] == [t.text for t in expected]


def test_int8_folder_translates_every_line(model_file, folder, sources, tmp_path):
    from nmt.runtime.translator import Translator as OnnxTranslator

    int8 = export_onnx(model_file, tmp_path / "int8", "--quantize", "int8")
    translator = OnnxTranslator.load(int8, quantize="int8")            # its own precision may be named
    assert translator.model.manifest.precision == "int8"
    assert all(t.text for t in translator.translate(sources, beam_size=5))
    for path, quantize in ((int8, "none"), (folder, "int8")):           # a precision it does not have: an error
        with pytest.raises(ConfigError, match=f"`decoding.quantize` {quantize} does not apply to this"):
            OnnxTranslator.load(path, quantize=quantize)


def test_the_api_loads_a_folder_in_a_list_and_refuses_it_in_an_ensemble(folder, sources):
    from nmt import ModelFileError, Translator
    from nmt.runtime.folder import OnnxFolderError
    from nmt.runtime.translator import Translator as OnnxTranslator

    assert isinstance(Translator.load([folder]), OnnxTranslator) and isinstance(Translator.load(folder), Translator)
    with pytest.raises(ConfigError, match="an ONNX model folder decodes alone, not in an ensemble"):
        Translator.load_ensemble([folder, folder])
    for threads in (-1, "2", 2.5, None, 10**5):
        with pytest.raises(ValueError, match="threads must be an integer from 0"):
            Translator.load(folder, threads=threads)
    assert issubclass(OnnxFolderError, ModelFileError)


def test_n_best_prefixes_and_attention_as_pytorch(model_file, folder, sources):
    from nmt.decode.translator import Translator as TorchTranslator
    from nmt.runtime.translator import Translator as OnnxTranslator

    want = TorchTranslator.load(model_file, device="cpu", precision="fp32", shortlist=False)
    got = OnnxTranslator.load(folder, shortlist=False)
    lines, prefixes = sources[:8] + [""], ["A", "", "Two", "", "", "The", "", "", ""]
    expected = want.translate(lines, n_best=3, beam_size=4, return_attention=True, prefixes=prefixes)
    found = got.translate(lines, n_best=3, beam_size=4, return_attention=True, prefixes=prefixes)
    for e, f in zip(expected, found, strict=True):
        assert [text for text, _ in f.nbest] == [text for text, _ in e.nbest]
        if e.attention is not None:
            assert f.attention.shape == tuple(e.attention.shape)
            assert abs(f.attention - e.attention.numpy()).max() < 1e-4
    assert found[-1].text == "" and found[-1].hypotheses == []


def test_translate_command_and_api_run_without_torch(model_file, folder, sources, no_torch_env, tmp_path):
    from nmt.decode.translator import Translator as TorchTranslator

    expected = [t.text for t in TorchTranslator.load(model_file, device="cpu", precision="fp32", shortlist=False)
                .translate(sources[:10], beam_size=5)]
    (tmp_path / "in.de").write_text("\n".join(sources[:10]) + "\n", encoding="utf-8")
    result = subprocess.run([sys.executable, "-m", "nmt", "translate", "-m", str(folder), "-i", str(tmp_path / "in.de"),
                             "--beam-size", "5", "--no-shortlist", "--threads", "1", "-q"],
                            capture_output=True, text=True, env=no_torch_env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == expected
    code = ("import sys; from nmt import Translator; t = Translator.load(sys.argv[1], shortlist=False); "
            "print(t.translate([sys.argv[2]], beam_size=5)[0].text); assert not {'torch', 'onnx'} & set(sys.modules)")
    result = subprocess.run([sys.executable, "-c", code, str(folder), sources[0]], capture_output=True, text=True,
                            env=no_torch_env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == expected[:1]


def test_serve_answers_nmt_and_libretranslate_routes_without_torch(folder, sources, no_torch_env, monkeypatch):
    from nmt.runtime.translator import Translator as OnnxTranslator

    expected = [t.text for t in OnnxTranslator.load(folder).translate(sources[:3])]
    monkeypatch.setattr(os, "environ", no_torch_env)                # the server's process: no torch
    server = Server(folder)
    try:
        status, _, body = server.translate(sources[:3])
        assert status == 200 and body == {"translations": expected}
        status, _, body = server.request("POST", "/translate", json.dumps(
            {"q": sources[0], "source": "de", "target": "en"}).encode(), {"Content-Type": "application/json"})
        assert status == 200 and body["translatedText"] == expected[0]
        status, _, body = server.request("GET", "/card")
        assert status == 200 and body["card"]["name"] == folder.name
    finally:
        assert server.stop() == 143


@pytest.mark.parametrize(("options", "message"), [
    (["--sampling"], "does not apply to an ONNX model folder"),
    (["--device", "cuda"], "runs on the CPU"),
    (["--n-best", "3", "--beam-size", "2"], "larger than the beam size"),
    (["--shortlist-k", "20", "--no-shortlist"], "`--shortlist-k` applies only with the shortlist on"),
    (["--beam-size", "1", "--early-stop"], "--early-stop applies only to beam search"),
])
def test_what_a_folder_cannot_do_is_one_error_line(folder, no_torch_env, tmp_path, options, message):
    result = subprocess.run([sys.executable, "-m", "nmt", "translate", "-m", str(folder), *options],
                            input="Ein Hund.\n", capture_output=True, text=True, env=no_torch_env, cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("error: ") and message in result.stderr and len(result.stderr.splitlines()) == 1


@pytest.mark.parametrize(("change", "message"), [
    ({"version": 99}, "nmt-onnx.json: version 99"),
    ({"languages": 5}, "nmt-onnx.json: a malformed value ('int' object is not iterable)"),
    ({"decoding": {"beam_size": 0}}, "nmt-onnx.json: `decoding.beam_size` must be >= 1, got 0; export the model"),
    ({"card": "DEEP"}, "nmt-onnx.json: not readable (JSON nested deeper than 32 levels)"),
])
def test_a_broken_manifest_is_named(folder, tmp_path, no_torch_env, change, message):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    manifest = {**json.loads((broken / "nmt-onnx.json").read_text()), **change}
    text = json.dumps(manifest).replace('"DEEP"', "[" * 5000 + "]" * 5000)
    (broken / "nmt-onnx.json").write_text(text)
    result = subprocess.run([sys.executable, "-m", "nmt", "translate", "-m", str(broken)], input="Ein Hund.\n",
                            capture_output=True, text=True, env=no_torch_env, cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and message in result.stderr, result.stderr


def rewrite_graphs(folder: Path, out: Path, change) -> Path:
    """A copy of `folder` whose graphs `change(model)` edits, its manifest's digests made to match: a folder from
    someone else may be consistent and still hostile."""
    import shutil

    from nmt.modelfile.onnx_folder import file_sha256

    onnx = pytest.importorskip("onnx")
    shutil.copytree(folder, out)
    for graph in out.glob("*.onnx"):
        model = onnx.load(str(graph), load_external_data=False)
        change(model)
        graph.write_bytes(model.SerializeToString())
    manifest = json.loads((out / "nmt-onnx.json").read_text())
    manifest["sha256"] = {name: file_sha256(out / name) for name in manifest["sha256"] if (out / name).exists()}
    (out / "nmt-onnx.json").write_text(json.dumps(manifest))
    return out


@pytest.mark.parametrize("name", ["weights.bin", "encoder.onnx", "sentencepiece.model", "missing"])
def test_a_damaged_folder_is_refused_not_translated(folder, tmp_path, no_torch_env, name):
    """As a model file's checksums: a copy with some bytes changed (here 4 zeroed in the middle of a file), or a
    file the manifest holds no digest for, is one error naming the file instead of translating wrongly."""
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(folder, bad)
    if name == "missing":
        manifest = json.loads((bad / "nmt-onnx.json").read_text())
        del manifest["sha256"]["weights.bin"]
        (bad / "nmt-onnx.json").write_text(json.dumps(manifest))
        name = "weights.bin"
    else:
        target = bad / (name if (bad / name).exists() else "source.model")
        name = target.name
        data = bytearray(target.read_bytes())
        data[len(data) // 2: len(data) // 2 + 4] = bytes(4) if any(data[len(data) // 2:][:4]) else b"\x01" * 4
        target.write_bytes(bytes(data))
    result = subprocess.run([sys.executable, "-m", "nmt", "translate", "-m", str(bad)], input="Ein Hund.\n",
                            capture_output=True, text=True, env=no_torch_env, cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert f"{bad / name} is damaged: its SHA-256 differs" in result.stderr and not result.stdout, result.stderr


@pytest.mark.parametrize("location", ["outside", "../weights.bin", "output.npz", "weights.bin\\x00.x"],
                         ids=["absolute", "up", "another_file", "nul"])
def test_a_graph_reading_another_file_is_refused_unread(folder, tmp_path, no_torch_env, location):
    """A folder may come from someone else: external data anywhere but the folder's weights.bin (an absolute
    path, out of the folder, another of its files) is one error naming the graph, before onnxruntime reads it."""
    outside = tmp_path / "outside.bin"
    outside.write_bytes((folder / "weights.bin").read_bytes())
    location = str(outside) if location == "outside" else location

    def point_elsewhere(model):
        tensor = next(t for t in model.graph.initializer if t.external_data)
        next(entry for entry in tensor.external_data if entry.key == "location").value = location

    bad = rewrite_graphs(folder, tmp_path / "bad", point_elsewhere)
    result = subprocess.run([sys.executable, "-m", "nmt", "translate", "-m", str(bad)], input="Ein Hund.\n",
                            capture_output=True, text=True, env=no_torch_env, cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == "" and len(result.stderr.splitlines()) == 1
    assert result.stderr.startswith(f"error: {bad / 'encoder.onnx'}: its external data is {location!r}")


def test_a_weights_file_that_links_out_of_the_folder_is_refused(folder, tmp_path, no_torch_env):
    import shutil

    linked = tmp_path / "linked"
    shutil.copytree(folder, linked)
    outside = tmp_path / "outside.bin"
    (linked / "weights.bin").rename(outside)
    (linked / "weights.bin").symlink_to(outside)
    result = subprocess.run([sys.executable, "-m", "nmt", "translate", "-m", str(linked)], input="Ein Hund.\n",
                            capture_output=True, text=True, env=no_torch_env, cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == "" and len(result.stderr.splitlines()) == 1
    assert result.stderr.startswith(f"error: {linked / 'weights.bin'}: a link out of the folder")


def test_external_data_is_found_wherever_a_graph_can_hold_a_tensor():
    """Initializers, a node's tensor attribute, a subgraph's initializers, a function's nodes: onnxruntime
    would read each of them, so the runtime's check must see each."""
    onnx = pytest.importorskip("onnx")
    from onnx import helper

    from nmt.runtime.external import external_locations

    def tensor(name: str, location: str):
        made = helper.make_tensor(name, onnx.TensorProto.FLOAT, [1], [0.0])
        made.data_location = onnx.TensorProto.EXTERNAL
        made.external_data.add(key="location", value=location)
        made.ClearField("float_data")
        return made

    branch = helper.make_graph([helper.make_node("Identity", ["b"], ["y"])], "branch", [],
                               [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
                               [tensor("b", "/up/there")])
    nodes = [helper.make_node("Constant", [], ["c"], value=tensor("c", "other.npz")),
             helper.make_node("If", ["cond"], ["z"], then_branch=branch, else_branch=branch)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("cond", onnx.TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, [1])],
                              [tensor("w", "weights.bin")])
    function = helper.make_function("f", "fn", [], ["k"], [helper.make_node("Constant", [], ["k"],
                                                                          value=tensor("k", "../fn"))],
                                    [helper.make_opsetid("", 17)])
    model = helper.make_model(graph, functions=[function])
    assert external_locations(model.SerializeToString()) == {"weights.bin", "other.npz", "/up/there", "../fn"}
    assert external_locations(helper.make_model(helper.make_graph([], "empty", [], [])).SerializeToString()) == set()
    with pytest.raises(ValueError):
        external_locations(model.SerializeToString()[:-3])


@pytest.mark.parametrize("command", [["info"], ["evaluate", "--ref", "REF", "--src", "REF", "-m"],
                                     ["export", "-o", "OUT"]])
def test_commands_that_need_the_model_file_say_a_folder_only_translates(folder, tmp_path, command):
    ref = tmp_path / "ref.en"
    ref.write_text("A dog.\n")
    args = [str(ref) if arg == "REF" else str(tmp_path / "out.nmt") if arg == "OUT" else arg for arg in command]
    result = subprocess.run([sys.executable, "-m", "nmt", *args, str(folder)], capture_output=True, text=True,
                            cwd=tmp_path, stdin=subprocess.DEVNULL)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "is an ONNX folder (nmt export --format onnx), which only translates and serves" in result.stderr


def test_score_names_the_folder(folder, tmp_path):
    (tmp_path / "a.de").write_text("Ein Hund.\n")
    (tmp_path / "a.en").write_text("A dog.\n")
    result = subprocess.run([sys.executable, "-m", "nmt", "score", "-m", str(folder), "--src", str(tmp_path / "a.de"),
                             "--tgt", str(tmp_path / "a.en")], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 2 and "is an ONNX folder, which only translates" in result.stderr


@pytest.mark.parametrize(("args", "message"), [
    (["translate", "-m", "typo-folder"], "error: model file typo-folder does not exist"),
    (["info", "MODEL"], "error: this needs torch, which this install lacks: nmt without PyTorch"),
    (["score", "-m", "MODEL", "--src", "MODEL", "--tgt", "MODEL"],
     "model.nmt is not an ONNX model folder (nmt export --format onnx), and this install has no PyTorch"),
])
def test_without_torch_a_command_that_needs_it_is_one_error_line(model_file, no_torch_env, tmp_path, args, message):
    """nmt-runtime (no PyTorch): a mistyped folder is named as missing, a command or model that needs PyTorch
    says so; neither is an "internal error"."""
    args = [str(model_file) if arg == "MODEL" else arg for arg in args]
    result = subprocess.run([sys.executable, "-m", "nmt", *args], input="Ein Hund.\n", capture_output=True,
                            text=True, env=no_torch_env, cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and message in result.stderr, result.stderr
    code = ("from nmt import Translator, ModelFileError\n"
            "try: Translator.load('typo-folder')\nexcept ModelFileError as e: print(e)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=no_torch_env,
                            cwd=tmp_path)
    assert result.stdout == "model file typo-folder does not exist\n", result.stderr
