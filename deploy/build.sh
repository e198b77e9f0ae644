#!/usr/bin/env bash
# Build the dlrover-kfp image and tag it with the package version from pyproject.toml.
#
#   deploy/build.sh                    docker build ... --tag registry.invalid/dlrover-kfp:VERSION
#   IMAGE=registry.example.com/ml/dlrover-kfp deploy/build.sh    your registry's repository
#   deploy/build.sh --dry-run          print the docker command instead of running it
#   deploy/build.sh --platform linux/amd64    other arguments go to `docker build` as they are
#
# The default is the name the KFP components and the job master use by default
# (dlrover_kfp/steps/image.py): no registry serves it (.invalid never resolves), so push to yours
# and set IMAGE, or load it into the nodes (kind load docker-image). IMAGE must name a registry:
# a bare name would be looked up on Docker Hub.
# Runs from any directory: the build context is the repository root (the .dockerignore at its top).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

dry_run=0
docker_args=()
for arg in "$@"; do
  case "$arg" in
    --dry-run) dry_run=1 ;;
    -h | --help)
      sed -n '2,14s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"
      exit 0
      ;;
    *) docker_args+=("$arg") ;;
  esac
done

# `version = "X"` in the [project] table of pyproject.toml (not some other table's version).
version=$(awk -F'"' '
  /^\[/ { in_project = ($0 == "[project]") }
  in_project && /^version[[:space:]]*=/ { print $2; exit }
' "$root/pyproject.toml")
if [[ ! "$version" =~ ^[0-9A-Za-z][0-9A-Za-z.+!_-]*$ ]]; then
  echo "deploy/build.sh: cannot read [project] version from $root/pyproject.toml" >&2
  exit 1
fi

image=${IMAGE:-registry.invalid/dlrover-kfp}
# The registry host is the first path component with a dot or a port, or localhost (the
# container runtime's own rule); the tag is this script's.
registry=${image%%/*}
if [[ "$image" != */* || ! ( "$registry" == *.* || "$registry" == *:* || "$registry" == localhost ) ]]; then
  echo "deploy/build.sh: IMAGE=$image names no registry (it would be looked up on Docker Hub); give registry/name, for example IMAGE=registry.example.com/ml/dlrover-kfp" >&2
  exit 2
fi
if [[ "${image##*/}" == *[:@]* ]]; then
  echo "deploy/build.sh: IMAGE=$image: give the repository without a tag; the tag is the version ($version)" >&2
  exit 2
fi
command=(docker build
  --file "$root/deploy/Dockerfile"
  --build-arg "VERSION=$version"
  --tag "$image:$version"
  ${docker_args[@]+"${docker_args[@]}"}
  "$root")

if ((dry_run)); then
  printf '%q' "${command[0]}"
  printf ' %q' "${command[@]:1}"
  printf '\n'
else
  exec "${command[@]}"
fi
