"""Run a command, stamp every output line with seconds since start, report the longest silence."""
import subprocess, sys, time, json
out_path = sys.argv[1]
cmd = sys.argv[2:]
t0 = time.monotonic()
last = t0
gaps = []
with open(out_path, "w") as log:
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    for line in p.stdout:
        now = time.monotonic()
        gaps.append((now - last, line.strip()[:120]))
        last = now
        log.write(f"{now - t0:8.1f} {line}")
        log.flush()
    rc = p.wait()
    end = time.monotonic()
    gaps.append((end - last, "<end>"))
    worst = sorted(gaps, reverse=True)[:5]
    log.write(f"# rc={rc} total={end - t0:.1f}s longest silences: " + json.dumps([[round(g, 1), l] for g, l in worst]) + "\n")
print(f"rc={rc} total={end - t0:.1f}s worst gap={worst[0][0]:.1f}s after {worst[0][1]!r}")
