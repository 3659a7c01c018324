import json, os, subprocess, sys
from concurrent.futures import ThreadPoolExecutor
cases = json.load(open(sys.argv[1]))
here = os.path.dirname(os.path.abspath(__file__))
def run(spec):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")}
    env.update(spec.get("env", {}))
    p = subprocess.run([sys.executable, os.path.join(here, "probe.py"), json.dumps(spec)], env=env, capture_output=True, text=True, timeout=120)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            r = json.loads(line[7:])
            r["rc"] = p.returncode
            r["stderr_tail"] = p.stderr[-600:]
            return r
    return {"spec": spec, "rc": p.returncode, "stdout": p.stdout[-1500:], "stderr_head": p.stderr[:2500]}
with ThreadPoolExecutor(14) as ex:
    results = list(ex.map(run, cases))
json.dump(results, open(sys.argv[2], "w"), indent=1)
print(len(results), "cases")
