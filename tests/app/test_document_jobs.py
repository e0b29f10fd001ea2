"""Document jobs in ``serve`` (``POST /documents``): a document translated in the background a chunk at a time, as
``translate --input --output`` translates it; its progress, its cancelling, and a server killed and started again on
the same ``--jobs`` directory finishing it."""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from app.support import SAMPLES, CorpusRun
from app.test_documents import multipart
from multihead.app.documents import formats, translate_document


def text(lines: int) -> str:
    """A text of ``lines`` lines, each two of the samples (a unit each), a blank line every ten."""
    return "".join(f"{SAMPLES[i % len(SAMPLES)]} {SAMPLES[(i + 1) % len(SAMPLES)]}\n" + ("\n" if i % 10 == 9 else "")
                   for i in range(lines))  # fmt: skip


def expected(corpus_run: CorpusRun, written: str, folder: Path) -> str:
    """``written`` (a text) as ``translate --input --output --format text`` translates it."""
    from multihead.app.translate import Translator

    source = folder / "seite.txt"
    source.write_text(written, encoding="utf-8")
    translate_document(source, folder / "cli.txt", formats()["text"], Translator(corpus_run.path).translate)
    return (folder / "cli.txt").read_text(encoding="utf-8")


def word(written: str) -> bytes:
    """A Word document of the lines of ``written``, a paragraph each (every third with a word in bold)."""
    import io

    import docx

    made = docx.Document()
    for number, line in enumerate(filter(None, written.splitlines())):
        first, _, rest = line.partition(" ")
        paragraph = made.add_paragraph()
        paragraph.add_run(first).bold = number % 3 == 0
        paragraph.add_run(" " + rest)
    out = io.BytesIO()
    made.save(out)
    return out.getvalue()


def paragraphs(data: bytes) -> list[list[tuple[str, bool]]]:
    """A Word document's paragraphs, each its runs' texts and whether they are bold."""
    import io

    import docx

    return [
        [(run.text, bool(run.bold)) for run in paragraph.runs]
        for paragraph in docx.Document(io.BytesIO(data)).paragraphs
    ]


def create(url: str, written: str | bytes, name: str = "seite.txt") -> str:
    """A job of the text ``written`` (or the file ``name`` of those bytes) created: its id."""
    from app.served import request

    data = written.encode() if isinstance(written, str) else written
    body, kind = multipart(name, data, source="de", target="en")
    status, answer = request(url, "/documents", body, kind=kind)
    assert (status, answer["status"]) == (202, "queued"), answer
    return str(answer["id"])


def finished(url: str, id: str, seen: list[dict[str, Any]], until: float = 60) -> None:
    """Poll the job ``id`` until it has ended (each answer added to ``seen``)."""
    from app.served import request

    deadline = time.monotonic() + until
    while not seen or seen[-1]["status"] in ("queued", "running"):
        assert time.monotonic() < deadline, seen[-3:]
        status, answer = request(url, f"/documents/{id}")
        assert status == 200, answer
        seen.append(answer)
        time.sleep(0.02)


def result(url: str, id: str, name: str = "seite.txt") -> bytes:
    with urllib.request.urlopen(f"{url}/documents/{id}/result", timeout=30) as response:
        assert f'filename="{name}"' in response.headers["content-disposition"]
        return bytes(response.read())


def test_a_document_job_is_translated_as_translate_does_its_progress_rising(
    corpus_run: CorpusRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``POST /documents`` answers 202 and an id; ``GET /documents/<id>`` the job's status and progress, which
    rises; its result, once done, is the file ``translate --input --output`` writes (409 before); a job deleted is
    cancelled and its files gone; an unknown id is a 404, a file refused as ``/translate_file`` refuses it."""
    from app.served import request, serving
    from multihead.app.serve import Limits, Service, create_app, document_jobs
    from multihead.app.translate import Translator

    monkeypatch.setattr(document_jobs, "CHUNK_UNITS", 2)  # many chunks: the progress seen rising
    written = text(120)
    want = expected(corpus_run, written, tmp_path)
    translator = Translator(corpus_run.path)
    jobs = document_jobs.DocumentJobs(tmp_path / "jobs")
    with serving(create_app(Service(translator, translator.langs or []), Limits(char_limit=20000), jobs)) as url:
        id = create(url, written)
        status, answer = request(url, f"/documents/{id}/result")
        assert status == 409, answer
        status, answer = request(url, "/translate", {"q": SAMPLES[0], "source": "de", "target": "en"})
        assert status == 200, answer  # a short request is answered while the job runs
        seen: list[dict[str, Any]] = []
        finished(url, id, seen)
        assert seen[-1] == {"id": id, "status": "done", "progress": 1.0, "seconds_left": None, "file": "seite.txt"}
        progress = [answer["progress"] for answer in seen]
        assert progress == sorted(progress), progress
        assert any(0 < found < 1 for found in progress), progress
        assert any(answer["seconds_left"] is not None for answer in seen), seen
        assert result(url, id).decode("utf-8") == want
        assert (tmp_path / "jobs" / id / "job.json").is_file()

        other = create(url, written)
        status, answer = request(url, f"/documents/{other}", method="DELETE")
        assert (status, answer) == (200, {"id": other, "status": "cancelled"})
        status, answer = request(url, f"/documents/{other}")
        assert (status, answer["status"]) == (200, "cancelled"), answer
        assert request(url, f"/documents/{other}/result")[0] == 409
        assert not (tmp_path / "jobs" / other).exists()
        assert request(url, f"/documents/{id}", method="DELETE")[0] == 200  # a job done: removed, forgotten
        for method, path in (("GET", id), ("GET", "0123"), ("DELETE", "0123"), ("GET", "0123/result")):
            status, answer = request(url, f"/documents/{path}", method=method)
            assert status == 404, answer
        body, kind = multipart("a.html", b"<p>" + b"Hund " * 5000, source="de", target="en")
        status, answer = request(url, "/documents", body, kind=kind)
        assert status == 400, answer
        assert "exceeds text limit (20000)" in answer["error"]
    assert not (tmp_path / "jobs" / ".lock").exists()


@pytest.mark.parametrize("name", ["seite.txt", "seite.docx"])
def test_a_server_killed_and_started_again_on_its_jobs_finishes_them(
    corpus_run: CorpusRun, tmp_path: Path, name: str
) -> None:
    """``serve --jobs DIR`` killed (SIGKILL) while a job runs, then started again on DIR: the job resumes where it
    stopped (the chunks done are not translated again) and its result is an uninterrupted run's (a Word document's
    paragraphs, runs and bold as ``translate --input --output`` writes them); a second server is refused DIR while
    the first holds it."""
    import json
    import subprocess
    import sys

    from app.served import start
    from app.support import subprocess_env

    written: str | bytes = text(1500)
    want: object = expected(corpus_run, str(written), tmp_path)
    if name.endswith(".docx"):
        from multihead.app.translate import Translator

        written = word(str(written))
        (tmp_path / name).write_bytes(written)
        translate_document(
            tmp_path / name, tmp_path / "cli.docx", formats()["docx"], Translator(corpus_run.path).translate
        )
        want = paragraphs((tmp_path / "cli.docx").read_bytes())
    jobs = tmp_path / "jobs"
    process, url, _ = start(corpus_run.path, "--jobs", str(jobs))
    try:
        id = create(url, written, name)
        seen: list[dict[str, Any]] = []
        finished_early = _until_progress(url, id, seen)
        refused = subprocess.run([sys.executable, "-m", "multihead", "serve", str(corpus_run.path), "--port", "0",
                                  "--jobs", str(jobs)], capture_output=True, text=True, env=subprocess_env(),
                                 timeout=60)  # fmt: skip
        assert refused.returncode == 2, refused.stderr
        assert "is in use by another multihead serve" in refused.stderr
    finally:
        process.kill()
        process.communicate(timeout=30)
    assert not finished_early, seen[-1]
    saved = json.loads((jobs / id / "job.json").read_text(encoding="utf-8"))
    assert saved["status"] == "running"
    done = sum(len(json.loads(line)["translations"]) for line in (jobs / id / "chunks.jsonl").open(encoding="utf-8"))
    assert 0 < done < saved["units"]
    process, url, _ = start(corpus_run.path, "--jobs", str(jobs))
    try:
        again: list[dict[str, Any]] = []
        finished(url, id, again)
        assert again[-1]["status"] == "done", again[-1]
        assert again[0]["progress"] >= round(done / saved["units"], 4) or again[0]["status"] == "queued"
        got = result(url, id, name)
        assert (paragraphs(got) if name.endswith(".docx") else got.decode("utf-8")) == want
    finally:
        process.terminate()
        process.communicate(timeout=60)
    assert process.returncode == 0
    assert (jobs / id / f"result{Path(name).suffix}").is_file()


def _until_progress(url: str, id: str, seen: list[dict[str, Any]]) -> bool:
    """Poll the job ``id`` until it has made some progress; whether it had already finished."""
    from app.served import request

    deadline = time.monotonic() + 60
    while not seen or seen[-1]["progress"] == 0:
        assert time.monotonic() < deadline, seen[-3:]
        seen.append(request(url, f"/documents/{id}")[1])
        time.sleep(0.01)
    return bool(seen[-1]["status"] == "done")
