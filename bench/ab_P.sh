#!/usr/bin/env bash
# Run P's second A/B (2026-12-03): one- and two-warp tiles at split counts sized to whole waves, against the
# production tiles at the production split counts (choose_splits: B 1 49 / 33, B 8 12, B 32 16).
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
t() { timeout 150 python3 bench/tile_ab.py --shape "$1" --configs "$2"; }
t 8:32768 on:128:1:4:168:12,on:32:1:1:168:24,on:32:1:1:168:48,on:32:1:1:152:26,on:32:1:1:152:52,on:64:1:2:168:24,off:64:1:4:80:12,off:64:1:1:0:16,off:64:1:1:200:20,off:64:1:1:0:32
t 32:32768 on:128:1:4:168:16,on:32:1:1:168:32,on:32:1:1:168:48,on:32:1:1:152:32,on:64:1:2:168:16,off:64:1:4:80:16,off:64:1:1:200:16,off:64:1:1:0:24
t 1:32768 on:128:1:4:168:49,on:64:1:2:200:64,on:64:1:2:168:64,on:32:1:1:168:64,off:128:1:8:0:33,off:64:1:1:0:64,off:64:1:2:0:64
t 8:131072 on:128:1:4:168:12,on:32:1:1:168:24,on:32:1:1:152:26,off:64:1:4:80:12,off:64:1:1:0:16,off:64:1:1:200:20
