#!/usr/bin/env bash
# The DRO-DS draft's REST calls (section 6) against a running Orrery, with curl. It works on
# objects of its own (a custom kind, a domain without an agent) and removes them at the end:
# your workloads and clusters are left as they were.
#
#   examples/dro-rest.sh                               # after `export KUBECONFIG=...` as `orrery up` prints
#   ORRERY_DATA_DIR=/path/to/data examples/dro-rest.sh
#
# The data directory is found as every orrery command finds it: ORRERY_DATA_DIR, else the
# directory of $KUBECONFIG when that is a data directory's admin.kubeconfig, else ./orrery-data.
set -euo pipefail
kc="${KUBECONFIG%%:*}"
if [ -n "${ORRERY_DATA_DIR:-}" ]; then
    data="$ORRERY_DATA_DIR"
elif [ -n "$kc" ] && [ "$(basename "$kc")" = admin.kubeconfig ]; then
    data="$(dirname "$kc")"
else
    data=./orrery-data
fi
if [ ! -f "$data/admin.kubeconfig" ]; then
    echo "no admin.kubeconfig in $data: is orrery up running there? (set ORRERY_DATA_DIR or KUBECONFIG)" >&2
    exit 1
fi
# The server and token of the admin kubeconfig (ORRERY_URL overrides the server).
url="${ORRERY_URL:-$(awk '/server:/ {print $2; exit}' "$data/admin.kubeconfig")}"
token=$(awk '/token:/ {print $2; exit}' "$data/admin.kubeconfig")
req() {
    local method=$1 path=$2 type=$3 body=${4:-}
    curl -sS --fail-with-body --cacert "$data/tls/ca.crt" -H "Authorization: Bearer $token" \
        -H "Content-Type: $type" -X "$method" ${body:+-d "$body"} "$url$path"
}
call() {
    echo "==> $1 $2" >&2
    req "$1" "$2" application/json "${3:-}"
    echo
}
cleanup() {
    echo "==> cleaning up" >&2
    req DELETE /api/v1/propagationpolicies/dro-example application/json >/dev/null 2>&1 || true
    req DELETE /apis/policy.karmada.io/v1alpha1/clusterpropagationpolicies/dro-example-crd \
        application/json >/dev/null 2>&1 || true
    req DELETE /apis/apiextensions.k8s.io/v1/customresourcedefinitions/droexamples.examples.orrery.io \
        application/json >/dev/null 2>&1 || true
    req DELETE /api/v1/clusters/gcp-production application/json >/dev/null 2>&1 || true
}
trap cleanup EXIT

# A kind of its own, so that the policy below selects nothing of yours.
echo "==> a custom kind, DroExample, and one object of it" >&2
req POST /apis/apiextensions.k8s.io/v1/customresourcedefinitions application/json '{
  "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
  "metadata": {"name": "droexamples.examples.orrery.io"},
  "spec": {"group": "examples.orrery.io", "scope": "Namespaced",
    "names": {"plural": "droexamples", "singular": "droexample", "kind": "DroExample"},
    "versions": [{"name": "v1", "served": true, "storage": true,
      "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}}' >/dev/null
for _ in $(seq 50); do
    req GET /apis/examples.orrery.io/v1/namespaces/default/droexamples application/json >/dev/null 2>&1 && break
    sleep 0.2
done
req POST /apis/examples.orrery.io/v1/namespaces/default/droexamples application/json \
    '{"apiVersion": "examples.orrery.io/v1", "kind": "DroExample", "metadata": {"name": "hello"}, "spec": {"greeting": "hi"}}' >/dev/null
# A member serves a kind only once its definition is there (the scheduler's APIEnablement
# filter): as with Karmada, the CRD goes to the members first, here to every cluster.
echo "==> the CRD to every member (a Karmada ClusterPropagationPolicy)" >&2
req POST /apis/policy.karmada.io/v1alpha1/clusterpropagationpolicies application/json '{
  "apiVersion": "policy.karmada.io/v1alpha1", "kind": "ClusterPropagationPolicy",
  "metadata": {"name": "dro-example-crd"},
  "spec": {"resourceSelectors": [{"apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition", "name": "droexamples.examples.orrery.io"}]}}' >/dev/null
# (each member reports the kind with its next status, a few seconds after the CRD lands there)
for c in aws-us-east gcp-europe; do
    for _ in $(seq 150); do
        req GET /apis/multicluster.io/v1alpha1/clusters/$c application/json 2>/dev/null |
            grep -q '"groupVersion":"examples.orrery.io/v1"' && break
        sleep 0.2
    done
done

# 6.2.1: register a domain (its agent would join with `orrery token create --cluster gcp-production`).
call POST /api/v1/clusters '{"name": "gcp-production", "endpoint": "https://k8s.gcp.example", "capabilities": ["gpu", "tls-encryption"]}'
call GET /api/v1/clusters
# 6.2.2: a policy in the draft's short form (every DroExample), then a merge patch.
call POST /api/v1/propagationpolicies '{"name": "dro-example", "resourceType": "DroExample", "targetClusters": ["aws-us-east", "azure-asia"]}'
echo "==> PATCH /api/v1/propagationpolicies/dro-example" >&2
req PATCH /api/v1/propagationpolicies/dro-example application/merge-patch+json \
    '{"targetClusters": ["aws-us-east", "gcp-europe"]}'
echo
# Where the patched policy put the DroExample (its ResourceBinding, once the scheduler
# decided again: the first placement, by the policy before the patch, may show first).
echo "==> the placement of DroExample hello" >&2
for _ in $(seq 100); do
    placed=$(req GET /apis/multicluster.io/v1alpha1/namespaces/default/resourcebindings/hello-droexample \
        application/json 2>/dev/null | grep -o '"clusters":\[[^]]*\]' | head -n 1 || true)
    case "$placed" in *gcp-europe*) break ;; esac
    sleep 0.2
done
echo "${placed:-not placed yet}"
# 6.3.1: the new domain's figures and an event.
call PUT /api/v1/metrics "{\"cluster\": \"gcp-production\", \"timestamp\": \"$(date -u +%Y-%m-%dT%H:%M:%SZ)\", \"cpuUsage\": 72.4, \"memoryAvailable\": 15.2}"
call POST /api/v1/metrics/events '{"cluster": "gcp-production", "type": "Warning", "reason": "LinkFlapping", "message": "uplink flapped twice"}'
# 6.4: the fleet now, and the history.
call GET /api/v1/monitor/realtime
call GET '/api/v1/history/schedules?maxEntries=5'
call GET /api/v1/history/failures
