# SPDX-License-Identifier: Apache-2.0
"""Starts a real TensorBoard server on loopback, asks it for scalars over HTTP, stops it.

Usage: serve_scalars.py LOGDIR RUN TAG... Prints "run RUN" for each run /data/runs lists, then
"scalar TAG STEP VALUE" for each point /data/plugin/scalars/scalars gives for RUN and TAG.
The server gets a free port, at most 60 s to serve RUN, and is stopped (killed after 10 s) at the end.
"""
import json
import os
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

logdir, run, tags = sys.argv[1], sys.argv[2], sys.argv[3:]
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
log = open(os.path.join(logdir, "tensorboard-server.log"), "wb")
server = subprocess.Popen(
    [sys.executable, "-m", "tensorboard.main", "--logdir", logdir, "--host", "127.0.0.1", "--port", str(port),
     "--load_fast", "false", "--reload_interval", "1"],
    stdout=log, stderr=subprocess.STDOUT)
base = "http://127.0.0.1:%d" % port


def get(path):
    with urllib.request.urlopen(base + path, timeout=10) as r:
        return json.load(r)


def scalars():
    points = {}
    for tag in tags:
        query = urllib.parse.urlencode({"run": run, "tag": tag})
        points[tag] = [(step, value) for _, step, value in get("/data/plugin/scalars/scalars?" + query)]
    return points


try:
    deadline = time.monotonic() + 60
    runs, points, previous = [], None, None
    # The files are complete before the server starts: wait until it lists the run and gives
    # the same non-empty series twice in a row (it may still be loading the first time).
    while points is None or points != previous or not all(points.values()):
        if server.poll() is not None:
            sys.exit("tensorboard exited with %d; see %s" % (server.returncode, log.name))
        if time.monotonic() > deadline:
            sys.exit("tensorboard did not serve run %r within 60 s (runs %r, scalars %r)" % (run, runs, points))
        time.sleep(0.5)
        try:
            runs = get("/data/runs")
            if run in runs:
                previous, points = points, scalars()
        except OSError:
            pass
    for r in runs:
        print("run", r)
    for tag in tags:
        for step, value in points[tag]:
            print("scalar", tag, step, repr(value))
finally:
    server.terminate()
    try:
        server.wait(10)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()
