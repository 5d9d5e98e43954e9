"""Live requests come first: on an engine of 4 sequences, a batch allowed all 4 holds back to
the sequences live requests leave free, so with 2 live streams running nothing waits (the
scheduler alone is first come, first served: the batch's next requests would queue beside the
live ones) and the batch still progresses on the other 2."""

from __future__ import annotations

from pathlib import Path

import openai

from macbatch.engine import Engine, EngineConfig, EngineThread
from macbatch.server.app import ServerOptions, stop_batches
from tests.support.batch_api import CHAT, batch_lines, jsonl, wait_for
from tests.support.live_server import serving
from tests.support.metrics_scrape import scrape
from tests.support.polling import wait_until

SEQS = 4


def test_live_requests_take_sequences_from_the_batch(tiny_model_path: Path, tmp_path: Path):
    config = EngineConfig(num_blocks=256, max_num_seqs=SEQS)
    thread = EngineThread(lambda: Engine.load(str(tiny_model_path), config)).start()
    thread.wait_ready(timeout=120)
    options = ServerOptions(data_dir=tmp_path, batch_max_in_flight=SEQS)
    try:
        with serving(thread, options) as server:
            client = openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0)
            upload = client.files.create(
                file=("rows.jsonl", jsonl(batch_lines(400, max_tokens=16))), purpose="batch"
            )
            batch = client.batches.create(
                input_file_id=upload.id, endpoint=CHAT, completion_window="24h"
            )
            wait_for(client, batch.id, lambda b: b.request_counts.completed >= SEQS)
            filled = lambda: scrape(server)["macbatch_requests_running"] == SEQS  # noqa: E731
            assert wait_until(filled)  # alone, the batch fills every sequence
            body = dict(model=thread.info.model_name, prompt="live", max_tokens=2000,
                        extra_body={"ignore_eos": True}, stream=True)  # fmt: skip
            streams = [client.completions.create(**body) for _ in range(2)]  # type: ignore[call-overload]
            for stream in streams:
                next(iter(stream))  # running
            start = client.batches.retrieve(batch.id).request_counts.completed
            samples = []
            while len(samples) < 20:
                metrics = scrape(server)
                if metrics["macbatch_requests_pending"] == 2:  # both live ones still running
                    samples.append((metrics["macbatch_requests_running"],
                                    metrics["macbatch_requests_waiting"]))  # fmt: skip
            end = client.batches.retrieve(batch.id).request_counts.completed
            assert scrape(server)["macbatch_requests_pending"] == 2, "live streams ended early"
            for stream in streams:
                stream.close()
            assert all(waiting == 0 and running <= SEQS for running, waiting in samples), samples
            assert end > start  # the batch went on beside them
            client.batches.cancel(batch.id)
            stop_batches(server.app)
    finally:
        thread.shutdown()
