"""bench/outside.sh's stand-in forge for the transfers: plain HTTP/1.1 on 127.0.0.1, each
connection on a thread of its own, nothing of leasegate's code.

    python3 bench/outside_forge.py PORT

A POST (an upload: its body of known length, or chunked) is read to its end in pieces of up to
1 MiB and answered with how many bytes it had; a GET of a path ending in /N (a download) is
answered with N bytes and their length, sent from one buffer. Anything else is 404.
"""

import socket
import sys
import threading

PIECE = 1 << 20
PAYLOAD = memoryview(b"x" * PIECE)


class Conn:
    """A client connection's socket and what was read of it but not yet used."""

    def __init__(self, sock):
        self.sock = sock
        self.buf = bytearray()
        # Where body bytes are read to be dropped: one buffer for the connection's life.
        self.scratch = memoryview(bytearray(PIECE))

    def fill(self):
        data = self.sock.recv(PIECE)
        if not data:
            raise EOFError
        self.buf += data

    def line(self):
        while b"\r\n" not in self.buf:
            self.fill()
        end = self.buf.index(b"\r\n")
        line = bytes(self.buf[:end])
        del self.buf[: end + 2]
        return line

    def skip(self, n):
        """Reads and drops n bytes of body: what is buffered, then straight from the socket."""
        take = min(n, len(self.buf))
        del self.buf[:take]
        n -= take
        while n > 0:
            got = self.sock.recv_into(self.scratch, min(n, PIECE))
            if got == 0:
                raise EOFError
            n -= got

    def body(self, length, chunked):
        if not chunked:
            self.skip(length)
            return length
        total = 0
        while True:
            size = int(self.line().split(b";")[0], 16)
            if size == 0:
                while self.line():
                    pass
                return total
            self.skip(size)
            self.line()
            total += size


def answer(sock, status, body=b""):
    sock.sendall(b"HTTP/1.1 %s\r\ncontent-length: %d\r\n\r\n%s" % (status, len(body), body))


def serve(sock):
    conn = Conn(sock)
    try:
        while True:
            method, path, _ = conn.line().split(b" ", 2)
            length, chunked = 0, False
            while True:
                header = conn.line()
                if not header:
                    break
                name, value = header.split(b":", 1)
                name = name.strip().lower()
                if name == b"content-length":
                    length = int(value)
                elif name == b"transfer-encoding" and b"chunked" in value.lower():
                    chunked = True
            got = conn.body(length, chunked)
            last = path.rsplit(b"/", 1)[-1]
            if method == b"POST":
                answer(sock, b"200 OK", str(got).encode())
            elif method == b"GET" and last.isdigit():
                n = int(last)
                sock.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n"
                             b"content-type: application/octet-stream\r\n\r\n" % n)
                while n > 0:
                    piece = min(n, PIECE)
                    sock.sendall(PAYLOAD[:piece])
                    n -= piece
            else:
                answer(sock, b"404 Not Found")
    except (EOFError, ConnectionError, ValueError):
        pass
    finally:
        sock.close()


def main():
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", int(sys.argv[1])))
    listener.listen(64)
    while True:
        sock, _ = listener.accept()
        threading.Thread(target=serve, args=(sock,), daemon=True).start()


if __name__ == "__main__":
    main()
