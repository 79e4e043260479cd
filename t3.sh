#!/bin/bash
trap 'sleep 1' USR1
bash -c "sleep $1; exit 3" &
run=$!
wait "$run"; status=$?
while kill -0 "$run" 2>/dev/null; do wait "$run"; status=$?; done
wait "$run"; status=$?
exit "$status"
