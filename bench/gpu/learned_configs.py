"""Writes a daemon's learned configs (its --state-dir's learned_configs.json):
PyTorch's defaults learned for each JOB of this uid's tenant, as if the job
had reached PEAK bytes reserved under them. A run of such a job is handed
the defaults and leaves its allocation stream off until it outgrows PEAK
(plus the autotuner's growth margin); bench/gpu/overhead.sh and
learned_stream.sh start their daemons with one.

    python learned_configs.py FILE PEAK JOB [JOB...]
"""
import json
import os
import sys


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    path, peak, jobs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    entry = {"config": "", "from_config": "max_split_size_mb:64", "decision_id": 1,
             "learned_unix_micros": 0, "predicted_peak_current": 0,
             "predicted_peak_switched": 0, "predicted_peak_allocated": 0,
             "predicted_peak_requested": 0, "realized_peak": peak}
    with open(path, "w") as f:
        json.dump({"format": 1, "jobs": [{"tenant": f"uid:{os.getuid()}", "job": job, **entry}
                                        for job in jobs]}, f)


if __name__ == "__main__":
    main()
