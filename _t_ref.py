import time, threading, uuid, tempfile, json, httpx, statistics
from pathlib import Path
from bench.victim import Page, function_indices, largest_model, STEP
from tests.support.server import AppServer
tmp = Path(tempfile.mkdtemp())
model = largest_model(tmp)
fns = function_indices()
server = AppServer({"DECODER_LAB_BEHIND_PROXY": "1", "DECODER_LAB_RATE_SCALE": "1", "DECODER_LAB_THREADS": "1", "DECODER_LAB_CLIENT_UPLOAD_MB": "1"}, tmp).start()
try:
    stop = threading.Event(); log=[]
    def probe():
        c = httpx.Client()
        while not stop.is_set():
            t0 = time.perf_counter(); c.get(server.url + "robots.txt"); log.append((time.perf_counter()-t0)*1000)
            time.sleep(0.01)
    th = threading.Thread(target=probe); th.start()
    time.sleep(1); base = list(log); log.clear()
    a = Page(server.url, "203.0.113.1", fns)
    t0=time.perf_counter(); n=0; answers={}
    while time.perf_counter()-t0 < 5:
        r = a.upload(model); n+=1; answers[str(r)[:50]] = answers.get(str(r)[:50],0)+1
    stop.set(); th.join()
    print("probe alone median", statistics.median(base), "during refused uploads median", statistics.median(log), "max", max(log), "uploads", n, answers)
finally:
    server.stop()
