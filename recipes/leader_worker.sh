#!/bin/sh
# A worker that acts only while its replica leads (POSIX sh, curl, GNU date).
#
#   SIDECAR=http://127.0.0.1:8001 RESOURCE=http://127.0.0.1:8080/objects/report \
#       sh leader_worker.sh
#
# Each round asks the sidecar's /leader. On a 200 it does one unit of work,
# here a PUT to RESOURCE with the answer's token in a Fencing-Token header,
# given no more time than the answer's valid_for_ms left since it asked; a
# 409 from the resource means leadership has moved on. Then it sleeps
# INTERVAL seconds (0.2). One line per round: `TOKEN STATUS`, or `follower`.
set -u
interval=${INTERVAL:-0.2}
while :; do
    asked=$(date +%s%N)
    if answer=$(curl -sf --max-time 1 "$SIDECAR/leader"); then
        token=$(printf %s "$answer" | sed -n 's/.*"token":\([0-9]*\).*/\1/p')
        valid=$(printf %s "$answer" | sed -n 's/.*"valid_for_ms":\([0-9]*\).*/\1/p')
        left=$((valid - ($(date +%s%N) - asked) / 1000000))
        if [ -n "$token" ] && [ "$left" -gt 0 ]; then
            status=$(curl -s -o /dev/null -w '%{http_code}' -X PUT \
                --max-time "$((left / 1000)).$(printf %03d $((left % 1000)))" \
                -H "Fencing-Token: $token" --data "work of $token" "$RESOURCE")
            echo "$token $status"
        fi
    else
        echo follower
    fi
    sleep "$interval"
done
