"""workers.media.decoding without a server: data URLs, decoding, frame sampling (files generated here)."""
from __future__ import annotations

import numpy as np
import pytest

from workers.media.limits import MediaSettings
from workers.media.decoding import MediaError, decode_audio, decode_image, decode_video, frame_indices, read_url

from . import media_files


def test_data_urls_decode_and_bad_ones_are_400_or_413():
    png = media_files.png_bytes(media_files.image(0))
    assert read_url(media_files.data_url("image/png", png), "p", MediaSettings()) == ("image/png", png)
    for url, status, code in [("data:image/png,abc", 400, "invalid_data_url"),
                              ("data:image/png;base64,@@@", 400, "invalid_base64"),
                              (media_files.data_url("image/png", png), 413, "media_too_large"),
                              ("ftp://example.invalid/x.png", 400, "invalid_url")]:
        with pytest.raises(MediaError) as error:
            read_url(url, "p", MediaSettings(max_bytes=100))
        assert (error.value.status, error.value.code, error.value.param) == (status, code, "p")


def test_private_and_loopback_hosts_are_refused_before_connecting():
    for url in ("http://127.0.0.1:9/x.png", "http://localhost:9/x.png", "http://[::1]:9/x.png"):
        with pytest.raises(MediaError) as error:
            read_url(url, "p", MediaSettings())
        assert error.value.code == "media_url_not_allowed"


def test_images_decode_to_rgb_and_garbage_is_400():
    picture = media_files.image(1)
    decoded = decode_image(media_files.png_bytes(picture.convert("L")), "p")
    assert decoded.mode == "RGB" and decoded.size == picture.size
    with pytest.raises(MediaError) as error:
        decode_image(b"GIF89a but not really", "p")
    assert (error.value.status, error.value.code) == (400, "invalid_image")


def test_audio_decodes_at_the_asked_rate_and_checks_its_format():
    samples = media_files.tone(1.5, 440)
    wav = media_files.wav_bytes(samples)
    decoded = decode_audio(wav, "p", 16000, "wav")
    assert decoded.dtype == np.float32 and np.abs(decoded - samples).max() < 1e-3
    assert len(decode_audio(wav, "p", 8000)) == len(samples) // 2
    mp3 = media_files.mp3_bytes(samples)
    assert abs(len(decode_audio(mp3, "p", 16000, "mp3")) - len(samples)) < 16000 * 0.1
    for data, audio_format, code in [(mp3, "wav", "invalid_audio"), (wav, "ogg", "unsupported_audio_format"),
                                     (b"\0" * 100, None, "invalid_audio"),
                                     (media_files.png_bytes(media_files.image(1)), None, "invalid_audio")]:
        with pytest.raises(MediaError) as error:
            decode_audio(data, "p", 16000, audio_format)
        assert (error.value.status, error.value.code) == (400, code)


def test_video_frames_are_sampled_evenly_and_exactly():
    frames = media_files.video_frames(12)
    decoded = decode_video(media_files.lossless_video_bytes(frames), "p", 4)
    assert frame_indices(12, 4) == [0, 3, 6, 9]
    assert [np.array_equal(np.array(got), np.array(frames[i])) for got, i in zip(decoded, [0, 3, 6, 9])] == [True] * 4
    assert len(decode_video(media_files.lossless_video_bytes(frames[:3]), "p", 8)) == 3
    with pytest.raises(MediaError) as error:
        decode_video(media_files.wav_bytes(media_files.tone(1, 440)), "p", 4)
    assert error.value.code == "invalid_video"


def test_a_host_whose_dns_answer_changes_after_the_check_is_not_reached(monkeypatch):
    """DNS rebinding: the first answer is public, the next one loopback. The fetch connects to the
    address it checked (which answers nothing here), never to the local server the second answer names."""
    import http.server
    import socket
    import threading

    hits: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            hits.append(self.path)
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.end_headers()
            self.wfile.write(b"secret")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    real_getaddrinfo = socket.getaddrinfo
    answers = iter(["192.0.32.10"])  # public (is_global); later answers: loopback

    def rebinding_resolver(host, *args, **kwargs):
        if host == "rebind.example":
            address = next(answers, "127.0.0.1")
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, server.server_port))]
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", rebinding_resolver)
    try:
        with pytest.raises(MediaError):
            read_url(f"http://rebind.example:{server.server_port}/internal.png", "p", MediaSettings(fetch_timeout=2))
        assert hits == [], "the fetch reached the address of a second DNS answer, not the one it checked"
    finally:
        server.shutdown()
