"""A hawkBit stand-in (its Direct Device Integration API) and a run of the image's SWUpdate daemon
against it, each run in network and mount namespaces of its own.

hawkBit cannot run here; the stand-in serves what hawkBit's DDI documentation
(https://eclipse.dev/hawkbit/apis/ddi_api/) and SWUpdate's suricatta client
(suricatta/server_hawkbit.c) agree on:

- ``GET /{tenant}/controller/v1/{id}``: ``config.polling.sleep`` and, while an action is open,
  ``_links.deploymentBase.href``;
- ``GET .../deploymentBase/{action}``: ``id``, ``deployment.download/update``, ``chunks`` with
  ``part``, ``version``, ``name`` and ``artifacts`` (``filename``, ``size``, ``hashes`` sha1,
  md5, sha256, ``_links.download-http.href``);
- the artifact's bytes; ``POST .../deploymentBase/{action}/feedback`` (``status.execution``,
  ``status.result.finished``, ``status.details``), recorded.

``python3 support_hawkbit.py RUN.json`` is the part that runs inside ``unshare --net --mount``
(root): loopback up, the stand-in on 127.0.0.1:8080 (the namespace's own port space, so the
URL baked into the image's swupdate.cfg is fixed), the board's ``etc`` laid over ``/etc``
(overlayfs: the launcher reads ``/etc/swupdate/conf.d`` at its real path), then SWUpdate's
launcher as the package ships it, ``/usr/lib/swupdate/swupdate.sh`` (meta-swupdate installs
the same script; swupdate.service runs it), until the action's last feedback. Its own network
namespace also keeps its SWUpdate off every other test's abstract NotifyServer socket.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

PORT = 8080
URL = f"http://127.0.0.1:{PORT}"
LAUNCHER = Path("/usr/lib/swupdate/swupdate.sh")
ACTION = 7


class Ddi(http.server.ThreadingHTTPServer):
    def __init__(self, tenant: str, device: str, swu: Path, version: str) -> None:
        super().__init__(("127.0.0.1", PORT), _Handler)
        self.tenant, self.device, self.swu, self.version = tenant, device, swu.read_bytes(), version
        self.name = swu.name
        self.paths: list[str] = []
        self.feedback: list[dict[str, Any]] = []
        self.done = threading.Event()

    @property
    def base(self) -> str:
        return f"{URL}/{self.tenant}/controller/v1/{self.device}"

    def deployment(self) -> dict[str, Any]:
        data = self.swu
        art = f"{URL}/{self.tenant}/controller/v1/{self.device}/softwaremodules/1/artifacts/{self.name}"
        return {
            "id": str(ACTION),
            "deployment": {
                "download": "forced",
                "update": "forced",
                "chunks": [
                    {
                        "part": "os",
                        "version": self.version,
                        "name": "alma-image",
                        "artifacts": [
                            {
                                "filename": self.name,
                                "hashes": {
                                    "sha1": hashlib.sha1(data).hexdigest(),
                                    "md5": hashlib.md5(data).hexdigest(),
                                    "sha256": hashlib.sha256(data).hexdigest(),
                                },
                                "size": len(data),
                                "_links": {"download-http": {"href": art}},
                            }
                        ],
                    }
                ],
            },
        }


class _Handler(http.server.BaseHTTPRequestHandler):
    server: Ddi

    def _send(self, code: int, body: bytes = b"", ctype: str = "application/hal+json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        s = self.server
        path = self.path.split("?", 1)[0]
        s.paths.append(path)
        if path == f"/{s.tenant}/controller/v1/{s.device}":
            body: dict[str, Any] = {"config": {"polling": {"sleep": "00:00:05"}}, "_links": {}}
            if not s.done.is_set():
                body["_links"]["deploymentBase"] = {"href": f"{s.base}/deploymentBase/{ACTION}?c=1"}
            self._send(200, json.dumps(body).encode())
        elif path == f"/{s.tenant}/controller/v1/{s.device}/deploymentBase/{ACTION}":
            self._send(200, json.dumps(s.deployment()).encode())
        elif path.endswith(f"/softwaremodules/1/artifacts/{s.name}"):
            self._send(200, s.swu, "application/octet-stream")
        else:
            self._send(404)

    def do_POST(self) -> None:
        s = self.server
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        path = self.path.split("?", 1)[0]
        s.paths.append(f"POST {path}")
        if path == f"/{s.tenant}/controller/v1/{s.device}/deploymentBase/{ACTION}/feedback":
            try:
                fb = json.loads(raw)
            except ValueError:
                fb = {"unparsed": raw.decode(errors="replace")}
            s.feedback.append(fb)
            status = fb.get("status", {}) if isinstance(fb, dict) else {}
            finished = status.get("result", {}).get("finished")
            details = " ".join(map(str, status.get("details", [])))
            if finished in ("success", "failure") or "All Chunks Installed" in details:
                s.done.set()
            self._send(200)
        else:
            self._send(404)

    def do_PUT(self) -> None:  # configData
        n = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(n)
        self.server.paths.append(f"PUT {self.path.split('?', 1)[0]}")
        self._send(200)

    def log_message(self, *args: object) -> None:
        pass


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """Inside the namespaces: serve, start the image's daemon, wait for the action's end."""
    board = Path(spec["board"])
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    ddi = Ddi(spec["tenant"], spec["device"], Path(spec["swu"]), spec["version"])
    threading.Thread(target=ddi.serve_forever, daemon=True).start()
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o", f"lowerdir={board / 'etc'}:/etc", "/etc"], check=True)
    tmp = Path(spec["tmp"])
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env |= {"TMPDIR": str(tmp), "ALMA_OTA_ROOT": str(board), "PATH": f"{board / 'bin'}:/usr/sbin:/usr/bin:/sbin:/bin"}
    with open(spec["log"], "wb") as log:
        # restore_signals=False: SIGPIPE stays ignored, as systemd runs swupdate.service
        # (IgnoreSIGPIPE=yes by default); with it at its default SWUpdate 2022.12 died of it.
        p = subprocess.Popen([str(LAUNCHER)], cwd=board, env=env, stdout=log, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, start_new_session=True, restore_signals=False)  # fmt: skip
        deadline = time.monotonic() + float(spec.get("deadline_s", 300))
        try:
            while not ddi.done.is_set() and p.poll() is None and time.monotonic() < deadline:
                ddi.done.wait(0.2)
            # then what the daemon's hooks do after its last feedback (the agent's adopt)
            until = spec.get("until")
            while until and p.poll() is None and time.monotonic() < deadline and not _holds(until):
                time.sleep(0.2)
        finally:
            exited = p.poll()
            if exited is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    ddi.shutdown()
    return {"paths": ddi.paths, "feedback": ddi.feedback, "done": ddi.done.is_set(), "exited": exited}


def _holds(until: dict[str, str]) -> bool:
    try:
        return until.get("text", "") in Path(until["path"]).read_text()
    except OSError:
        return False


def run_daemon(tmp: Path, board: Path, swu: Path, *, tenant: str, device: str, version: str,
               until: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    """Run the image's SWUpdate daemon on ``board`` against a DDI stand-in offering ``swu``;
    with ``until`` (``path`` and ``text``), past the action's end until that file holds that text."""
    import pytest
    from support import require_tool

    if os.geteuid() != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("the hawkBit test needs root (network and mount namespaces, overlayfs)")
        pytest.skip("needs root: network and mount namespaces, overlayfs")
    require_tool("swupdate")
    require_tool("unshare")
    if not LAUNCHER.is_file():
        pytest.fail(f"{LAUNCHER} missing: Debian's swupdate package ships it (apt-get install swupdate)")
    work = tmp / "ddi-run"
    (work / "tmp").mkdir(parents=True)
    spec = {"board": str(board), "swu": str(swu), "tenant": tenant, "device": device, "version": version,
            "tmp": str(work / "tmp"), "log": str(work / "swupdate.log"), "until": until}  # fmt: skip
    (work / "run.json").write_text(json.dumps(spec))
    unshare = shutil.which("unshare", path="/usr/bin:/bin") or "unshare"
    r = subprocess.run([unshare, "--net", "--mount", "--", sys.executable, __file__, str(work / "run.json")],
                       capture_output=True, text=True, timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    out: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    out["log"] = (work / "swupdate.log").read_text(errors="replace")
    return out


if __name__ == "__main__":
    print(json.dumps(run(json.loads(Path(sys.argv[1]).read_text()))))
