#!/usr/bin/env bash
# The DRO-DS draft's REST calls (section 6) against a running Orrery, with curl.
#
#   ORRERY_DATA=./orrery-data ORRERY_URL=https://127.0.0.1:6443 examples/dro-rest.sh
set -euo pipefail
data="${ORRERY_DATA:-./orrery-data}"
url="${ORRERY_URL:-https://127.0.0.1:6443}"
token=$(awk '/token:/ {print $2}' "$data/admin.kubeconfig")
call() {
    local method=$1 path=$2 body=${3:-}
    echo "==> $method $path" >&2
    curl -sS --fail-with-body --cacert "$data/tls/ca.crt" -H "Authorization: Bearer $token" \
        -H 'Content-Type: application/json' -X "$method" ${body:+-d "$body"} "$url$path"
    echo
}
# 6.2.1: register a domain (its agent joins with `orrery token create --cluster gcp-production`).
call POST /api/v1/clusters '{"name": "gcp-production", "endpoint": "https://k8s.gcp.example", "capabilities": ["gpu", "tls-encryption"]}'
call GET /api/v1/clusters
# 6.2.2: a policy in the draft's short form, then a merge patch.
call POST /api/v1/propagationpolicies '{"name": "cross-region-policy", "resourceType": "Deployment", "targetClusters": ["aws-us-east", "azure-asia"]}'
curl -sS --fail-with-body --cacert "$data/tls/ca.crt" -H "Authorization: Bearer $token" \
    -H 'Content-Type: application/merge-patch+json' -X PATCH \
    -d '{"targetClusters": ["aws-us-east", "gcp-europe"]}' "$url/api/v1/propagationpolicies/cross-region-policy"
echo
# 6.3.1: a domain's figures and an event.
call PUT /api/v1/metrics "{\"cluster\": \"aws-us-east\", \"timestamp\": \"$(date -u +%Y-%m-%dT%H:%M:%SZ)\", \"cpuUsage\": 72.4, \"memoryAvailable\": 15.2}"
call POST /api/v1/metrics/events '{"cluster": "aws-us-east", "type": "Warning", "reason": "LinkFlapping", "message": "uplink flapped twice"}'
# 6.4: the fleet now, and the history.
call GET /api/v1/monitor/realtime
call GET '/api/v1/history/schedules?maxEntries=5'
call GET /api/v1/history/failures
# Clean up what this script made.
call DELETE /api/v1/propagationpolicies/cross-region-policy
call DELETE /api/v1/clusters/gcp-production
