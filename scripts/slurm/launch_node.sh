#!/usr/bin/env bash
# One machine's launch line of a multi-machine job: `accelerate launch` of train.py with the total process
# count, this machine's rank, the rendezvous at the first machine and, for a config with a device mesh (HSDP),
# the mesh of the launch, all from SLURM's variables. scripts/slurm/train_multinode.sbatch runs it once per node
# (srun, one task per node); it runs as well by hand, on a cluster without SLURM, or from a test, given the
# variables:
#
#   SLURM_NNODES=2 SLURM_NODEID=0 SLURM_GPUS_ON_NODE=8 MAIN_PROCESS_IP=10.0.0.1 \
#       bash scripts/slurm/launch_node.sh accelerate_configs/hsdp.yaml --preset gpt2 ...
#
#   $1                  the accelerate config (ddp_multinode.yaml, fsdp.yaml, hsdp.yaml, ...); the rest: train.py's flags
#   SLURM_NNODES        machines in the job (--num_machines)
#   SLURM_NODEID        this machine's index, 0 on the first (--machine_rank)
#   SLURM_GPUS_ON_NODE  processes per machine, one per GPU (PROCESSES_PER_NODE overrides it)
#   MAIN_PROCESS_IP     the first machine's address (the batch script takes it from SLURM_JOB_NODELIST)
#   MAIN_PROCESS_PORT   the rendezvous port on it (default 29500)
#   MIXED_PRECISION     no, fp16 or bf16 (--mixed_precision); default: the config's
#   MAX_RESTARTS        restarts of the job after a process fails (--max_restarts); default: none
#
# The mesh follows the launch: a config with a parallelism_config (hsdp.yaml) gets accelerate's overrides
# --parallelism_config_dp_replicate_size SLURM_NNODES --parallelism_config_dp_shard_size processes-per-machine,
# so one hsdp.yaml serves any N machines x M GPUs (its own sizes are the 2 x 2 example); DDP and FSDP configs
# need none.
#
# The rendezvous is torch's c10d store at MAIN_PROCESS_IP:MAIN_PROCESS_PORT, hosted by machine 0 (is_host says
# which, rather than leaving torch to guess from host names, which fails on machines with several names or
# interfaces). It relies on accelerate handing torchrun that address as --rdzv_endpoint, which accelerate does
# exactly when --same_network is not passed: this line never passes it, and accelerate ignores the configs'
# same_network key (its flag's default wins), which the configs therefore leave out. With --same_network
# accelerate would set only the master address, and c10d, given no endpoint, would wait on localhost.
# With c10d, torchrun numbers the machines in the order they join, so the run folder is written by whichever
# holds rank 0: give --output_dir on a file system all machines share (train.py checks it at start-up).
set -euo pipefail
usage="usage: launch_node.sh ACCELERATE_CONFIG [train.py flags...] (with SLURM_NNODES, SLURM_NODEID, SLURM_GPUS_ON_NODE, MAIN_PROCESS_IP set)"
config=${1:?$usage}
shift
num_machines=${SLURM_NNODES:?$usage}
machine_rank=${SLURM_NODEID:?$usage}
per_node=${PROCESSES_PER_NODE:-${SLURM_GPUS_ON_NODE:?$usage}}
main_ip=${MAIN_PROCESS_IP:?$usage}
main_port=${MAIN_PROCESS_PORT:-29500}
[[ -f $config ]] || { echo "error: no accelerate config $config" >&2; exit 2; }
for count in "$num_machines" "$per_node"; do
    [[ $count =~ ^[1-9][0-9]*$ ]] || {
        echo "error: machines ($num_machines) and processes per machine ($per_node) must be positive whole numbers" >&2
        exit 2
    }
done
(( machine_rank < num_machines )) || {
    echo "error: machine rank $machine_rank is not one of the job's $num_machines machines" >&2
    exit 2
}
mesh=()
if grep -q '^parallelism_config:' "$config"; then
    mesh=(--parallelism_config_dp_replicate_size "$num_machines" --parallelism_config_dp_shard_size "$per_node")
fi
precision=()
[[ -z ${MIXED_PRECISION:-} ]] || precision=(--mixed_precision "$MIXED_PRECISION")
restarts=()
[[ -z ${MAX_RESTARTS:-} ]] || restarts=(--max_restarts "$MAX_RESTARTS")
# Every round of the rendezvous (each restart) gets a store of its own, hosted by that round's rank 0 on a
# free port: with the store shared across rounds, the process group's keys of a restarted job carry
# torchrun's restart count, which it keeps per machine (pytorch issue 108158), so the machines disagree.
export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
is_host=$([[ $machine_rank == 0 ]] && echo 1 || echo 0)
repo=$(cd "$(dirname "$0")/../.." && pwd)

# Paths in the flags stay relative to where the job was started (sbatch: the submit directory).
exec accelerate launch --config_file "$config" \
    --num_machines "$num_machines" --num_processes $((num_machines * per_node)) --machine_rank "$machine_rank" \
    "${mesh[@]}" --main_process_ip "$main_ip" --main_process_port "$main_port" \
    --rdzv_backend c10d --rdzv_conf "is_host=$is_host" "${precision[@]}" "${restarts[@]}" \
    "$repo/train.py" "$@"
