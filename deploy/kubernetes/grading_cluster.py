"""The course's Dask grading cluster on Kubernetes (dask-kubernetes operator).

    python deploy/kubernetes/grading_cluster.py --image REGISTRY/transformer-course:TAG --workers 4 \\
        | kubectl apply --namespace grading -f -

prints a DaskCluster resource; the dask-kubernetes operator (installed once, see README.md)
starts its scheduler and workers, all from the course's own image, and a Service named
`course-grading-scheduler`. From an instructor's server:

    make grade VENV=/opt/course/.venv SCHEDULER=tcp://course-grading-scheduler.grading:8786

`make grade` sends every job to the workers; each runs the submission inside bubblewrap
(autograder/isolation.py). bubblewrap run as root needs CAP_SYS_ADMIN to make its namespaces and
mounts, and a container that seccomp and AppArmor do not confine: WORKER_SECURITY below, which
only a namespace that admits privileged pods accepts (Pod Security Standard "privileged"). Without
it the workers still grade, with the fallback that `make grade` names in its first lines (rlimits
only: submitted code then sees the worker's file system and what it holds for the job; the image
itself holds no solutions, deploy/kubernetes/Dockerfile.dockerignore).
`--no-sandbox-privileges` writes that weaker spec on purpose.
"""

from __future__ import annotations

import argparse
import sys

from dask_kubernetes.operator import make_cluster_spec

NAME = "course-grading"
SCHEDULER_PORT = 8786
DASK = "/opt/course/.venv/bin/dask"  # the image's Dask: the same version as the grader's client
WORKER_COMMAND = f"{DASK} worker --nthreads 1"  # one job at a time per worker process, as `make grade` runs them
SCHEDULER_COMMAND = [DASK, "scheduler", "--host", "0.0.0.0", "--port", str(SCHEDULER_PORT)]
RESOURCES = {"requests": {"cpu": "1", "memory": "3G"}, "limits": {"cpu": "1", "memory": "6G"}}
ENV = {"OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
WORKER_SECURITY = {
    "runAsUser": 0,
    "runAsGroup": 0,
    "allowPrivilegeEscalation": True,
    "capabilities": {"add": ["SYS_ADMIN", "SETUID", "SETGID", "SETPCAP"]},
    "seccompProfile": {"type": "Unconfined"},
    "appArmorProfile": {"type": "Unconfined"},
}


def cluster_spec(image: str, workers: int = 2, sandbox_privileges: bool = True, pull_secret: str | None = None) -> dict:
    spec = make_cluster_spec(name=NAME, image=image, n_workers=workers, resources=RESOURCES, env=ENV,
                             worker_command=WORKER_COMMAND)
    scheduler = spec["spec"]["scheduler"]["spec"]["containers"][0]
    scheduler["args"] = list(SCHEDULER_COMMAND)
    worker = spec["spec"]["worker"]["spec"]["containers"][0]
    if sandbox_privileges:
        worker["securityContext"] = dict(WORKER_SECURITY)
    if pull_secret:  # a private registry: the secret lives in this namespace, not the hub's (README, step 1)
        for pod in (spec["spec"]["scheduler"]["spec"], spec["spec"]["worker"]["spec"]):
            pod["imagePullSecrets"] = [{"name": pull_secret}]
    # Only the cluster's own pods, the operator and instructors' servers may reach the scheduler.
    spec["metadata"]["labels"] = {"app.kubernetes.io/part-of": "transformer-course"}
    return spec


def network_policy(hub_namespace: str = "jhub", operator_namespace: str = "dask-operator") -> dict:
    """Students' servers must not reach the scheduler: it runs any task it is sent on the workers."""
    def namespace(name):
        return {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": name}}}

    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": f"{NAME}-ingress"},
        "spec": {
            "podSelector": {"matchLabels": {"dask.org/cluster-name": NAME}},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [
                {"podSelector": {"matchLabels": {"dask.org/cluster-name": NAME}}},
                dict(namespace(hub_namespace), podSelector={"matchLabels": {"course-role": "instructor"}}),
                namespace(operator_namespace),
            ]}],
        },
    }


def main(argv=None) -> int:
    import json

    import yaml

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--image", required=True, help="the course image (the hub's singleuser.image)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--hub-namespace", default="jhub")
    ap.add_argument("--operator-namespace", default="dask-operator")
    ap.add_argument("--no-sandbox-privileges", action="store_true",
                    help="workers without CAP_SYS_ADMIN: grading falls back to weaker isolation")
    ap.add_argument("--image-pull-secret", help="a docker-registry secret in the grading namespace, for a private registry")
    args = ap.parse_args(argv)
    docs = [cluster_spec(args.image, args.workers, not args.no_sandbox_privileges, args.image_pull_secret),
            network_policy(args.hub_namespace, args.operator_namespace)]
    yaml.safe_dump_all(json.loads(json.dumps(docs)), sys.stdout, sort_keys=False)  # no YAML anchors
    return 0


if __name__ == "__main__":
    sys.exit(main())
