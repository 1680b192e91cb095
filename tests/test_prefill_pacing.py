"""The prefill budget per engine step: a share of one decode step's time while streams run, everything otherwise."""
from __future__ import annotations

from workers.engine.core.prefill_pacing import LEAST_TOKENS, PrefillPacer


def test_with_nothing_to_decode_or_nothing_measured_a_step_takes_the_whole_chunk():
    pacer = PrefillPacer(512)
    assert pacer.budget(decoding=True) == 512  # nothing measured yet
    pacer.decoded(0.040)
    pacer.prefilled(1000, 0.5)
    assert pacer.budget(decoding=False) == 512


def test_while_streams_run_a_step_prefills_what_fits_in_its_share_of_a_decode_step():
    pacer = PrefillPacer(512, decode_share=1.0)
    pacer.decoded(0.100)
    pacer.prefilled(400, 0.200)  # 0.5 ms a token
    assert pacer.budget(decoding=True) == 200
    pacer.decoded(0.100 + 5 * 0.100)  # a slower decode step lets more in, through the moving average
    assert pacer.budget(decoding=True) == 400
    half = PrefillPacer(512)  # the default: half a decode step
    half.decoded(0.100)
    half.prefilled(400, 0.200)
    assert half.budget(decoding=True) == 100
    assert PrefillPacer(512, decode_share=0.5).budget(decoding=False) == 512


def test_the_budget_stays_between_the_floor_and_the_chunk():
    pacer = PrefillPacer(512)
    pacer.decoded(0.001)
    pacer.prefilled(100, 1.0)
    assert pacer.budget(decoding=True) == LEAST_TOKENS
    pacer.decoded(100.0)
    pacer.decoded(100.0)
    assert pacer.budget(decoding=True) == 512
    assert PrefillPacer(8).budget(decoding=True) == 8


def test_the_share_setting_reaches_the_engines_pacer():
    from inference_site.inference_settings import InferenceSettings
    from workers.engine.core.engine import Engine

    config = InferenceSettings.from_environ({"INFERENCE_PREFILL_SHARE": "0.25"}).engine
    assert Engine(lambda channel, message: None, config).scheduler.pacer.share == 0.25
