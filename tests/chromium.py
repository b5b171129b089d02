"""Drive Debian's chromium, headless, through the DevTools protocol.

The protocol runs over a pipe (--remote-debugging-pipe: commands on the
browser's fd 3, answers and events on its fd 4, each message a JSON text
ended by a NUL byte), so nothing but the standard library is needed.
"""

import base64
import json
import os
import select
import shutil
import struct
import subprocess
import tempfile
import time
import zlib


class BrowserError(Exception):
    """The browser failed to start or to answer."""


def find():
    """The path of chromium, or None."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


class Browser:
    """A headless chromium with one page, driven by DevTools commands."""

    def __init__(self, executable, timeout=60):
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="chromium")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        # The browser reads fd 3 and writes fd 4.  subprocess would close
        # them after fds() (close_fds); os.pipe()'s own descriptors are not
        # inheritable, and exec closes them.  They may be 3 or 4 already:
        # copies first, then the inheritable 3 and 4 from them.
        def fds():
            read_end, write_end = os.dup(to_browser_r), os.dup(from_browser_w)
            os.dup2(read_end, 3)
            os.dup2(write_end, 4)
        self.proc = subprocess.Popen(
            [executable, "--headless=new", "--no-sandbox", "--disable-gpu",
             "--no-first-run", "--no-default-browser-check",
             "--disable-extensions", "--remote-debugging-pipe",
             "--user-data-dir=" + self.profile, "about:blank"],
            preexec_fn=fds, close_fds=False,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        self.events = []
        self.session = None
        targets = self.command("Target.getTargets")["targetInfos"]
        pages = [t for t in targets if t["type"] == "page"]
        if not pages:
            target = self.command("Target.createTarget",
                                  url="about:blank")["targetId"]
        else:
            target = pages[0]["targetId"]
        self.session = self.command("Target.attachToTarget",
                                    targetId=target,
                                    flatten=True)["sessionId"]
        self.command("Page.enable")

    def close(self):
        try:
            if self.proc.poll() is None:
                try:
                    self.command("Browser.close", session=False)
                except BrowserError:
                    pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        finally:
            self.proc.stderr.close()
            os.close(self._to_browser)
            os.close(self._from_browser)
            shutil.rmtree(self.profile, ignore_errors=True)

    def _read_message(self, deadline):
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if (left <= 0 or not
                    select.select([self._from_browser], [], [], left)[0]):
                raise BrowserError("chromium did not answer in %d s"
                                   % self.timeout)
            chunk = os.read(self._from_browser, 1 << 16)
            if not chunk:
                raise BrowserError("chromium exited: %s" % self.stderr())
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def stderr(self, timeout=5):
        """The end of what chromium wrote to stderr, once it has exited:
        until EOF, or for timeout seconds (a child of chromium that lives
        on keeps stderr open).  Read from the pipe's fd: nothing else
        reads it."""
        if self.proc.poll() is None:
            return "(still running)"
        data = b""
        fd = self.proc.stderr.fileno()
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                data += b"\n(stderr still open after %d s)" % timeout
                break
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            data += chunk
        return data.decode("utf-8", "replace")[-2000:]

    def command(self, method, session=True, **params):
        """Send a DevTools command; its result, or BrowserError."""
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params}
        if session and self.session:
            message["sessionId"] = self.session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            answer = self._read_message(deadline)
            if answer.get("id") == self._next_id:
                if "error" in answer:
                    raise BrowserError("%s: %s" % (method, answer["error"]))
                return answer.get("result", {})
            self.events.append(answer)

    def evaluate(self, expression):
        """The value of a JavaScript expression in the page."""
        result = self.command("Runtime.evaluate", expression=expression,
                              returnByValue=True)
        if "exceptionDetails" in result:
            raise BrowserError("%s: %s" % (expression,
                                           result["exceptionDetails"]))
        return result["result"].get("value")

    def open(self, url):
        """Load url and wait until its document is complete."""
        self.command("Page.navigate", url=url)
        deadline = time.monotonic() + self.timeout
        while self.evaluate("document.readyState") != "complete" or \
                self.evaluate("document.URL") != url:
            if time.monotonic() > deadline:
                raise BrowserError("%s did not load" % url)
            time.sleep(0.05)

    def click(self, x, y):
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            self.command("Input.dispatchMouseEvent", type=kind, x=x, y=y,
                         button="left" if kind != "mouseMoved" else "none",
                         clickCount=1 if kind != "mouseMoved" else 0)

    def screenshot(self, width, height):
        """A PNG of the page at width x height CSS pixels, as bytes."""
        self.command("Emulation.setDeviceMetricsOverride", width=width,
                     height=height, deviceScaleFactor=1, mobile=False)
        data = self.command("Page.captureScreenshot", format="png")["data"]
        return base64.b64decode(data)


def png_pixels(data):
    """(width, height, [row bytes]) of an 8-bit RGB or RGBA PNG."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, color_type = header[:4]
    if depth != 8 or color_type not in (2, 6):
        raise ValueError("PNG of depth %d, color type %d" % (depth,
                                                             color_type))
    channels = 3 if color_type == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * channels
    rows, previous = [], bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind = raw[start]
        row = bytearray(raw[start + 1:start + 1 + stride])
        for i in range(stride):
            left = row[i - channels] if i >= channels else 0
            up = previous[i]
            corner = previous[i - channels] if i >= channels else 0
            if kind == 1:
                row[i] = (row[i] + left) & 0xFF
            elif kind == 2:
                row[i] = (row[i] + up) & 0xFF
            elif kind == 3:
                row[i] = (row[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                pred = left if pa <= pb and pa <= pc else (
                    up if pb <= pc else corner)
                row[i] = (row[i] + pred) & 0xFF
        rows.append(bytes(row))
        previous = row
    return width, height, channels, rows


def colors(data):
    """{(r, g, b): number of pixels} of a PNG."""
    width, height, channels, rows = png_pixels(data)
    found = {}
    for row in rows:
        for x in range(0, width * channels, channels):
            pixel = tuple(row[x:x + 3])
            found[pixel] = found.get(pixel, 0) + 1
    return found
