#!/bin/sh
# A VM's startup script: train from the latest checkpoint until done. Give it to the
# VM as GCE's `startup-script` metadata, AWS EC2 user data or Azure custom data.
#
# The handler finds the cloud through its metadata server and watches its notices:
# GCE host maintenance and Spot preemption (exit code 143), AWS Spot interruption
# (42; the notice's time, 2 minutes ahead, caps the grace period) and Azure
# Preempt/Terminate scheduled events (42; their NotBefore caps it). After the save
# the VM goes away. When the cloud starts one again (a managed instance group, an
# Auto Scaling group, a scale set), this script runs again and training resumes at
# the saved step, so keep the checkpoints where the next VM finds them: a persistent
# disk attached again, a network file system, or gs:// on GCE.
#
# tests/examples/test_examples.py runs this script against fake GCE, AWS and Azure
# metadata servers on 127.0.0.1: notice, save, exit code, restart, finish.
set -eu
PYTHON=${PYTHON:-python3}
TRAIN=${TRAIN:-/opt/train/mwms_custom_loop.py}
CKPT_DIR=${CKPT_DIR:-/mnt/checkpoints/run-1}
echo "startup: $(date -u +%FT%TZ) $TRAIN --ckpt-dir $CKPT_DIR ${TRAIN_ARGS:-}"
# exec: the training is the process the cloud's shutdown signals reach.
exec "$PYTHON" "$TRAIN" --ckpt-dir "$CKPT_DIR" ${TRAIN_ARGS:-}
