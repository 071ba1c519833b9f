"""GPU profiles of Qwen3.6-27B under SGLang: decode step time vs running requests, prefill time, memory, accept
length, per GPU and weights, built from a roofline of published hardware figures (`roofline`, `constants`) or
measured, in one JSON format (`profile.GpuProfile`), checked against the seed run and a public figure (`anchors`).
"""
