import time, threading, uuid, tempfile, json, httpx, subprocess, sys, statistics
from pathlib import Path
from bench.victim import Page, function_indices, largest_model, STEP
from tests.support.server import AppServer
tmp = Path(tempfile.mkdtemp())
model = largest_model(tmp)
fns = function_indices()
server = AppServer({"DECODER_LAB_BEHIND_PROXY": "1", "DECODER_LAB_RATE_SCALE": "1", "DECODER_LAB_THREADS": "1"}, tmp).start()
try:
    a = Page(server.url, "203.0.113.1", fns); v = Page(server.url, "198.51.100.1", fns)
    sh = uuid.uuid4().hex; v.call("step", [None, *STEP], sh)
    stop = threading.Event(); log=[]
    T0=time.perf_counter()
    def victim():
        while not stop.is_set():
            t0 = time.perf_counter(); v.call("step", [None, *STEP], sh); log.append((round(t0-T0,2), round((time.perf_counter()-t0)*1000)))
            time.sleep(0.05)
    th = threading.Thread(target=victim); th.start()
    spy = subprocess.Popen(["py-spy", "record", "--gil", "--threads", "--nonblocking", "-r", "100", "-f", "raw", "-o", "/tmp/spy3.txt", "--pid", str(server.proc.pid), "-d", "10"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    for i in range(5):
        t0=time.perf_counter(); sent = a.upload(model); t1=time.perf_counter()
        r = a.call("upload_model", [None, sent], uuid.uuid4().hex)
        print(round(t0-T0,2), round((t1-t0)*1000), round((time.perf_counter()-t1)*1000), r)
    spy.wait(); stop.set(); th.join()
    print("victim slow:", [x for x in log if x[1] > 60], "median", statistics.median(x[1] for x in log))
finally:
    server.stop()
