#!/bin/bash
# Burns CPU with N busy processes for S seconds (default 4*nproc, 30 s).
n=${1:-$((4 * $(nproc)))}; s=${2:-30}
for i in $(seq "$n"); do timeout "$s" bash -c 'while :; do :; done' & done
wait
