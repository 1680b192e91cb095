#!/usr/bin/env python
"""Django's command-line utility for administrative tasks."""
import faulthandler
import os
import sys


def main() -> None:
    # a fatal signal (an abort in a native library, a crash) leaves every thread's Python stack in the log
    if not faulthandler.is_enabled():
        faulthandler.enable(all_threads=True)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "inference_site.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
