"""Issue 64, defect 4: a reload stays inside ``--honest-root`` (every file resolved and checked, symlinks
included), reads regular files only (a FIFO is refused at once, never waited on, and later reloads still
work), and its errors name no path outside the root (tiny real model, real HTTP)."""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi")

from candor.serve import HonestModel  # noqa: E402
from candor.serve.honest_folder import read_config  # noqa: E402
from candor.serve.http.app import ServeSettings, create_app  # noqa: E402
from candor.serve.http.server import serve_in_thread  # noqa: E402
from candor.util.errors import CandorError  # noqa: E402
from tests.test_serve_app import KEY, post  # noqa: E402
from tests.test_serve_feedback import honest_model, save  # noqa: E402

ADMIN = "operator-key-not-secret"
SECRET = "SECRET_MODEL_PATH"


@pytest.fixture(scope="module")
def backend(tiny_model, tokenizer):
    from candor.backends.hf import HFBackend

    return HFBackend(tiny_model, tokenizer, batch_size=8)


def release(fifo: Path) -> None:
    """Give a reader blocked on ``fifo`` its end of file (the code before the fix waits there forever)."""
    with contextlib.suppress(OSError):  # nobody reads it: nothing waits
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


@pytest.fixture()
def rooted(backend, tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    save(honest_model(backend, 0.0), root / "honest", "v1")
    save(honest_model(backend, 0.0), outside / "evil", "evil")
    settings = ServeSettings(api_key=KEY, admin_key=ADMIN, honest_folder=root / "honest", honest_root=root)
    app = create_app(HonestModel.from_pretrained(root / "honest", backend=backend), settings)
    with serve_in_thread(app) as url:
        yield url, app, root, outside


def reload(url: str, folder: str, timeout: float = 20) -> tuple[int, dict]:
    return post(f"{url}/admin/reload", {"honest": folder}, key=ADMIN, timeout=timeout)


def refused(answer: tuple[int, dict], *outside: str) -> str:
    status, body = answer
    assert status == 400 and body["error"]["code"] == "reload_failed", body
    message = body["error"]["message"]
    for text in (*outside, SECRET, "/etc", "Errno"):
        assert text not in message, message
    return message


def test_a_file_symlinked_out_of_the_root_is_refused_and_not_named(rooted):
    url, app, root, outside = rooted
    (root / "x").mkdir()
    (root / "x" / "honest.json").symlink_to(outside / "evil" / "honest.json")
    message = refused(reload(url, "x"), str(outside))
    assert "x/honest.json" in message and "outside --honest-root" in message, message
    # A symlink deeper down (a head's file, say) is checked too.
    (root / "y").mkdir()
    (root / "y" / "honest.json").write_bytes((root / "honest" / "honest.json").read_bytes())
    (root / "y" / "deep").mkdir()
    (root / "y" / "deep" / "weights.bin").symlink_to(outside / "evil" / "honest.json")
    assert "y/deep/weights.bin" in refused(reload(url, "y"), str(outside))
    assert app.state.service.current.version == "v1"
    # A symlink that stays inside the root is followed.
    (root / "z").mkdir()
    (root / "z" / "honest.json").symlink_to(root / "honest" / "honest.json")
    assert reload(url, "z")[0] == 200


def test_paths_that_honest_json_names_must_resolve_inside_the_root(rooted, tmp_path):
    url, app, root, outside = rooted
    config = json.loads((root / "honest" / "honest.json").read_text())
    secret = tmp_path / SECRET
    secret.mkdir()
    named = {
        "model-abs": {**config, "generator": {**config["generator"], "model": str(secret)}},
        "model-etc": {**config, "generator": {**config["generator"], "model": "/etc"}},
        "model-up": {**config, "generator": {**config["generator"], "model": "../../" + SECRET}},
        "adapter": {**config, "generator": {**config["generator"], "adapter": "../../outside/evil"}},
        "head": {**config, "confidence": {"kind": "head", "head": str(outside / "evil")}},
    }
    for name, body in named.items():
        (root / name).mkdir()
        (root / name / "honest.json").write_text(json.dumps(body))
        message = refused(reload(url, name), str(outside), str(tmp_path))
        assert "outside --honest-root" in message, (name, message)
    assert app.state.service.current.version == "v1"


def test_a_fifo_in_the_root_is_refused_at_once_and_later_reloads_still_work(rooted, backend):
    url, app, root, _ = rooted
    (root / "pipe").mkdir()
    fifo = root / "pipe" / "honest.json"
    os.mkfifo(fifo)
    deep = root / "deeper"
    save(honest_model(backend, 0.0), deep, "v-deep")
    os.mkfifo(deep / "pipe")
    try:
        start = time.monotonic()
        message = refused(reload(url, "pipe"))
        assert "pipe/honest.json" in message and "not a regular file" in message, message
        assert "deeper/pipe" in refused(reload(url, "deeper"))
        save(honest_model(backend, 1.0), root / "next", "v2")
        status, body = reload(url, "next")
        assert status == 200 and body["model_version"] == "v2", body
        assert time.monotonic() - start < 20  # the bound of each call: nothing waited on the FIFO
    finally:
        release(fifo)
        release(deep / "pipe")


def test_files_are_read_only_when_regular(tmp_path):
    from candor.util.files import NotRegularFile, read_regular_bytes

    fifo = tmp_path / "honest.json"
    os.mkfifo(fifo)
    try:
        with pytest.raises(NotRegularFile):
            read_regular_bytes(fifo)
        with pytest.raises(CandorError, match="not a regular file"):
            read_config(tmp_path)
        with pytest.raises(NotRegularFile):
            read_regular_bytes("/dev/null")
    finally:
        release(fifo)
    (tmp_path / "plain").write_bytes(b"ok")
    assert read_regular_bytes(tmp_path / "plain") == b"ok"
