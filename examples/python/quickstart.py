"""corral from Python: create a sandbox, run commands, move files.

Start the service first (see the README, or the book's "The Python client"):

    target/debug/corral serve            # http://127.0.0.1:7070

then:

    target/pyenv/bin/python examples/python/quickstart.py

The service is $CORRAL_URL (default http://127.0.0.1:7070). Its bearer token
is $CORRAL_TOKEN, else the one a local service generated, which the client
reads from the service's token file by itself.
"""

import sys

import corral


def main() -> int:
    try:
        with corral.Sandbox() as sb:  # created now, deleted at the end of the block
            print(f"sandbox {sb.id} (container {sb.container_id[:12]}, image {sb.image})")

            r = sb.run("echo hello from $(hostname); uname -sm", timeout=10)
            print(f"exit {r.exit_code} in {r.duration_ms:.1f} ms:")
            print(r.stdout, end="")

            sb.write_file("/tmp/greeting.txt", "written from Python\n")
            r = sb.run("tr a-z A-Z < /tmp/greeting.txt > /tmp/shout.txt")
            print("read back:", sb.read_text("/tmp/shout.txt"), end="")

            for ev in sb.stream("for i in 1 2 3; do echo tick $i; sleep 0.3; done"):
                if ev.is_output:
                    print("streamed:", ev.text, end="")

            try:
                sb.run("sleep 60", timeout=1)
            except corral.SandboxTimeoutError as err:
                print(f"timed out as asked: {err.kind}, retryable={err.retryable}")
    except corral.ServiceUnavailableError as err:
        print(f"{err.message}\nstart it with: target/debug/corral serve", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
