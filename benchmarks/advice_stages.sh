#!/bin/bash
# Issue 13's CPU run of benchmarks/advice.py, in the stages it was run in (about 2 h 20 min on 2 cores).
# Every stage is cached under benchmarks/cache/advice, so a killed run resumes; the third stage writes
# results/advice.json with every method, the fourth results/advice_unseen.json.
set -ex
cd "$(dirname "$0")/.."
P=${PYTHON:-.venv/bin/python}
M=Default,Prompting,Self-Consistency,ConfTuner,ADVICE,ADVICE+ConfTuner
$P -m benchmarks.advice --methods Default,ADVICE --formats letter,number --ablation none
$P -m benchmarks.advice --methods Default,ADVICE,ConfTuner,ADVICE+ConfTuner --formats letter,number --ablation sum
$P -m benchmarks.advice --methods $M --formats letter,number --ablation sum
$P -m benchmarks.advice --methods Default,ADVICE --formats text,float --ablation none \
  --out benchmarks/results/advice_unseen.json
