//! SPDY/3.1 framing, as much of it as a port-forward server speaks: kubectl (1.31 and newer)
//! tunnels port-forward's SPDY/3.1 connection inside a WebSocket
//! (`SPDY/3.1+portforward.k8s.io`), and the simulated member answers it as a kubelet would.
//!
//! Header blocks are compressed as one zlib stream per direction with the protocol's preset
//! dictionary: the decoder inflates what the client's compressor wrote (back-references may
//! reach into the dictionary and into earlier frames' headers), the encoder writes stored
//! (uncompressed) deflate blocks, which every zlib reader takes. Flow control is not kept:
//! Kubernetes' SPDY library (spdystream) ignores WINDOW_UPDATE in both directions.

use bytes::{Buf, BytesMut};
use miniz_oxide::inflate::TINFLStatus;
use miniz_oxide::inflate::core::inflate_flags::TINFL_FLAG_HAS_MORE_INPUT;
use miniz_oxide::inflate::core::{DecompressorOxide, decompress};

/// A header name and one of its values (a name with several values comes once per value).
pub(super) type Headers = Vec<(String, String)>;

#[derive(Debug, thiserror::Error, PartialEq)]
pub(super) enum SpdyError {
    #[error("SPDY version {0} (only 3 is spoken)")]
    Version(u16),
    #[error("malformed {0} frame")]
    Malformed(&'static str),
    #[error("header block: {0}")]
    Headers(&'static str),
}

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Frame {
    SynStream {
        id: u32,
        fin: bool,
        headers: Headers,
    },
    SynReply {
        id: u32,
        fin: bool,
        headers: Headers,
    },
    RstStream {
        id: u32,
        status: u32,
    },
    Ping(u32),
    GoAway {
        last: u32,
        status: u32,
    },
    Headers {
        id: u32,
        fin: bool,
        headers: Headers,
    },
    Data {
        id: u32,
        fin: bool,
        data: Vec<u8>,
    },
    /// SETTINGS, WINDOW_UPDATE and CREDENTIAL: read and let be.
    Ignored(u16),
}

const VERSION: u16 = 3;
const SYN_STREAM: u16 = 1;
const SYN_REPLY: u16 = 2;
const RST_STREAM: u16 = 3;
const PING: u16 = 6;
const GOAWAY: u16 = 7;
const HEADERS: u16 = 8;
const FLAG_FIN: u8 = 0x01;
/// RST_STREAM's status for a stream the receiver will not take.
pub(super) const REFUSED_STREAM: u32 = 3;
/// GOAWAY's status after a protocol error.
pub(super) const GOAWAY_PROTOCOL_ERROR: u32 = 1;

/// The most a header block may inflate to (a client's headers are a few dozen bytes; this
/// bounds what a hostile stream can make the member allocate).
const MAX_HEADER_BLOCK: usize = 256 * 1024;
/// The size of deflate's window: the decoder keeps the last 32 KiB it produced.
const WINDOW: usize = 32 * 1024;
/// The zlib header the encoder starts its stream with: deflate with a 32 KiB window (CMF),
/// and a preset dictionary (FLG's FDICT bit); `(CMF << 8 | FLG)` is a multiple of 31.
const ZLIB_CMF: u8 = 0x78;
const ZLIB_FLG: u8 = 0x20;

/// Adler-32 (RFC 1950), the checksum zlib names a preset dictionary by.
fn adler32(data: &[u8]) -> u32 {
    let (mut a, mut b) = (1u32, 0u32);
    for chunk in data.chunks(5552) {
        for &x in chunk {
            a += u32::from(x);
            b += a;
        }
        a %= 65521;
        b %= 65521;
    }
    b << 16 | a
}

/// Inflates a zlib stream that continues across frames, with SPDY's preset dictionary.
struct Inflater {
    state: Box<DecompressorOxide>,
    window: Box<[u8]>,
    pos: usize,
    /// The zlib header's bytes read so far (2, and 4 more naming the dictionary).
    header: Vec<u8>,
    header_read: bool,
}

impl Inflater {
    fn new() -> Self {
        // A preset dictionary is deflate's window filled before the first byte: back-references
        // of the first blocks reach into it.
        let mut window = vec![0u8; WINDOW].into_boxed_slice();
        window[..DICTIONARY.len()].copy_from_slice(DICTIONARY);
        Self {
            state: Box::default(),
            window,
            pos: DICTIONARY.len(),
            header: Vec::with_capacity(6),
            header_read: false,
        }
    }

    fn inflate(&mut self, mut input: &[u8]) -> Result<Vec<u8>, SpdyError> {
        while !self.header_read {
            let Some((&b, rest)) = input.split_first() else {
                return Ok(Vec::new());
            };
            input = rest;
            self.header.push(b);
            match self.header.as_slice() {
                [cmf, flg] => {
                    if cmf & 0x0f != 8 || (u16::from(*cmf) << 8 | u16::from(*flg)) % 31 != 0 {
                        return Err(SpdyError::Headers("not a zlib stream"));
                    }
                    self.header_read = flg & 0x20 == 0;
                }
                [_, _, id @ ..] if id.len() == 4 => {
                    if id != adler32(DICTIONARY).to_be_bytes() {
                        return Err(SpdyError::Headers("compressed with another dictionary"));
                    }
                    self.header_read = true;
                }
                _ => {}
            }
        }
        let mut out = Vec::new();
        loop {
            let (status, read, written) = decompress(
                &mut self.state,
                input,
                &mut self.window,
                self.pos,
                TINFL_FLAG_HAS_MORE_INPUT,
            );
            out.extend_from_slice(&self.window[self.pos..self.pos + written]);
            self.pos = (self.pos + written) & (WINDOW - 1);
            input = &input[read..];
            if out.len() > MAX_HEADER_BLOCK {
                return Err(SpdyError::Headers("inflates beyond 256 KiB"));
            }
            match status {
                // Each block ends with a sync flush: all of it is out once the input is in.
                TINFLStatus::NeedsMoreInput if input.is_empty() => return Ok(out),
                TINFLStatus::HasMoreOutput => {}
                TINFLStatus::Done => return Err(SpdyError::Headers("the zlib stream ended")),
                _ => return Err(SpdyError::Headers("corrupt compressed data")),
            }
        }
    }
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

/// A name/value header block: a count, then each name and value with its length (several
/// values of one name joined by NUL).
fn parse_headers(mut b: &[u8]) -> Result<Headers, SpdyError> {
    fn take<'a>(b: &mut &'a [u8]) -> Result<&'a [u8], SpdyError> {
        if b.len() < 4 {
            return Err(SpdyError::Headers("cut short"));
        }
        let n = be32(b) as usize;
        let rest = &b[4..];
        if rest.len() < n {
            return Err(SpdyError::Headers("cut short"));
        }
        let (v, rest) = rest.split_at(n);
        *b = rest;
        Ok(v)
    }
    if b.len() < 4 {
        return Err(SpdyError::Headers("cut short"));
    }
    let count = be32(b) as usize;
    b = &b[4..];
    if count > b.len() / 8 {
        return Err(SpdyError::Headers("more headers than bytes"));
    }
    let mut headers = Vec::with_capacity(count);
    for _ in 0..count {
        let name = String::from_utf8_lossy(take(&mut b)?).to_ascii_lowercase();
        let value = take(&mut b)?;
        for v in value.split(|c| *c == 0) {
            headers.push((name.clone(), String::from_utf8_lossy(v).into_owned()));
        }
    }
    if !b.is_empty() {
        return Err(SpdyError::Headers("bytes after the last header"));
    }
    Ok(headers)
}

fn header_block(headers: &Headers) -> Vec<u8> {
    let mut names: Vec<&str> = Vec::new();
    for (n, _) in headers {
        if !names.contains(&n.as_str()) {
            names.push(n);
        }
    }
    let mut out = Vec::new();
    out.extend_from_slice(&(names.len() as u32).to_be_bytes());
    for name in names {
        let values: Vec<&str> = headers
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .collect();
        let value = values.join("\0");
        let name = name.to_ascii_lowercase();
        out.extend_from_slice(&(name.len() as u32).to_be_bytes());
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&(value.len() as u32).to_be_bytes());
        out.extend_from_slice(value.as_bytes());
    }
    out
}

/// Reads frames from the bytes of a connection as they come.
pub(super) struct Decoder {
    buf: BytesMut,
    inflater: Inflater,
}

impl Default for Decoder {
    fn default() -> Self {
        Self {
            buf: BytesMut::new(),
            inflater: Inflater::new(),
        }
    }
}

impl Decoder {
    pub(super) fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next whole frame, `None` until its bytes are all in.
    pub(super) fn next_frame(&mut self) -> Result<Option<Frame>, SpdyError> {
        if self.buf.len() < 8 {
            return Ok(None);
        }
        let first = be32(&self.buf[..4]);
        let flags = self.buf[4];
        let len = (be32(&self.buf[4..8]) & 0x00ff_ffff) as usize;
        if self.buf.len() < 8 + len {
            return Ok(None);
        }
        self.buf.advance(8);
        let p = self.buf.split_to(len);
        let fin = flags & FLAG_FIN != 0;
        if first & 0x8000_0000 == 0 {
            return Ok(Some(Frame::Data {
                id: first & 0x7fff_ffff,
                fin,
                data: p.to_vec(),
            }));
        }
        let version = ((first >> 16) & 0x7fff) as u16;
        if version != VERSION {
            return Err(SpdyError::Version(version));
        }
        let kind = (first & 0xffff) as u16;
        let id = |name| match p.len() >= 4 {
            true => Ok(be32(&p) & 0x7fff_ffff),
            false => Err(SpdyError::Malformed(name)),
        };
        Ok(Some(match kind {
            SYN_STREAM => {
                if p.len() < 10 {
                    return Err(SpdyError::Malformed("SYN_STREAM"));
                }
                let headers = parse_headers(&self.inflater.inflate(&p[10..])?)?;
                Frame::SynStream {
                    id: id("SYN_STREAM")?,
                    fin,
                    headers,
                }
            }
            SYN_REPLY | HEADERS => {
                let name = if kind == SYN_REPLY {
                    "SYN_REPLY"
                } else {
                    "HEADERS"
                };
                let id = id(name)?;
                let headers = parse_headers(&self.inflater.inflate(&p[4..])?)?;
                match kind {
                    SYN_REPLY => Frame::SynReply { id, fin, headers },
                    _ => Frame::Headers { id, fin, headers },
                }
            }
            RST_STREAM if p.len() == 8 => Frame::RstStream {
                id: id("RST_STREAM")?,
                status: be32(&p[4..]),
            },
            PING if p.len() == 4 => Frame::Ping(be32(&p)),
            GOAWAY if p.len() == 8 => Frame::GoAway {
                last: id("GOAWAY")?,
                status: be32(&p[4..]),
            },
            RST_STREAM => return Err(SpdyError::Malformed("RST_STREAM")),
            PING => return Err(SpdyError::Malformed("PING")),
            GOAWAY => return Err(SpdyError::Malformed("GOAWAY")),
            other => Frame::Ignored(other),
        }))
    }
}

/// Writes frames; header blocks go out as stored deflate blocks of one zlib stream, each
/// followed by a sync flush.
#[derive(Default)]
pub(super) struct Encoder {
    started: bool,
}

impl Encoder {
    fn compress(&mut self, raw: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(raw.len() + 16);
        if !self.started {
            self.started = true;
            out.extend_from_slice(&[ZLIB_CMF, ZLIB_FLG]);
            out.extend_from_slice(&adler32(DICTIONARY).to_be_bytes());
        }
        for chunk in raw.chunks(0xffff) {
            // BFINAL 0, BTYPE 00 (stored), then LEN and its complement, little-endian.
            let len = chunk.len() as u16;
            out.push(0);
            out.extend_from_slice(&len.to_le_bytes());
            out.extend_from_slice(&(!len).to_le_bytes());
            out.extend_from_slice(chunk);
        }
        // A sync flush (an empty stored block), as zlib ends each block: Go's inflater hands
        // out a stored block's bytes only when it reaches the next block.
        out.extend_from_slice(&[0, 0, 0, 0xff, 0xff]);
        out
    }

    fn control(kind: u16, flags: u8, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 + payload.len());
        out.extend_from_slice(&(0x8000 | VERSION).to_be_bytes());
        out.extend_from_slice(&kind.to_be_bytes());
        out.extend_from_slice(&(payload.len() as u32 | u32::from(flags) << 24).to_be_bytes());
        out.extend_from_slice(payload);
        out
    }

    pub(super) fn encode(&mut self, frame: &Frame) -> Vec<u8> {
        let fin_flag = |fin: bool| if fin { FLAG_FIN } else { 0 };
        match frame {
            Frame::SynStream { id, fin, headers } => {
                let mut p = id.to_be_bytes().to_vec();
                p.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
                p.extend(self.compress(&header_block(headers)));
                Self::control(SYN_STREAM, fin_flag(*fin), &p)
            }
            Frame::SynReply { id, fin, headers } | Frame::Headers { id, fin, headers } => {
                let kind = match frame {
                    Frame::SynReply { .. } => SYN_REPLY,
                    _ => HEADERS,
                };
                let mut p = id.to_be_bytes().to_vec();
                p.extend(self.compress(&header_block(headers)));
                Self::control(kind, fin_flag(*fin), &p)
            }
            Frame::RstStream { id, status } | Frame::GoAway { last: id, status } => {
                let kind = match frame {
                    Frame::RstStream { .. } => RST_STREAM,
                    _ => GOAWAY,
                };
                let mut p = id.to_be_bytes().to_vec();
                p.extend_from_slice(&status.to_be_bytes());
                Self::control(kind, 0, &p)
            }
            Frame::Ping(id) => Self::control(PING, 0, &id.to_be_bytes()),
            Frame::Data { id, fin, data } => {
                // A frame's length has 24 bits: more data goes in several frames.
                let mut out = Vec::with_capacity(16 + data.len());
                let chunks: Vec<&[u8]> = match data.is_empty() {
                    true => vec![&[]],
                    false => data.chunks(0x00ff_ffff).collect(),
                };
                let last = chunks.len() - 1;
                for (i, chunk) in chunks.into_iter().enumerate() {
                    let flags = u32::from(fin_flag(*fin && i == last));
                    out.extend_from_slice(&(id & 0x7fff_ffff).to_be_bytes());
                    out.extend_from_slice(&(chunk.len() as u32 | flags << 24).to_be_bytes());
                    out.extend_from_slice(chunk);
                }
                out
            }
            Frame::Ignored(_) => Vec::new(),
        }
    }
}

/// Reads the frames of `bytes` as the port-forward server reads a connection, `split` bytes
/// at a time (`0`: all at once), and checks each: written again, the frames read back the
/// same. The fuzz targets' entry (`fuzz/`): a hostile stream is an error (`Err`, with the
/// frames read before it), never a panic. The number of frames read.
pub fn read_frames(bytes: &[u8], split: usize) -> Result<usize, (usize, String)> {
    let mut d = Decoder::default();
    let mut frames = Vec::new();
    let step = if split == 0 {
        bytes.len().max(1)
    } else {
        split
    };
    for chunk in bytes.chunks(step) {
        d.push(chunk);
        loop {
            match d.next_frame() {
                Ok(Some(f)) => frames.push(f),
                Ok(None) => break,
                Err(e) => return Err((frames.len(), e.to_string())),
            }
        }
    }
    let mut e = Encoder::default();
    let mut again = Decoder::default();
    for f in frames.iter().filter(|f| !matches!(f, Frame::Ignored(_))) {
        again.push(&e.encode(f));
        let back = again.next_frame();
        assert_eq!(
            back.as_ref().ok().and_then(Option::as_ref),
            Some(&as_written(f)),
            "a frame written reads back"
        );
    }
    Ok(frames.len())
}

/// A frame as the encoder writes it: a header block names each header once, its values in
/// order (what a client sent under one name twice comes back together), names lowercased.
fn as_written(f: &Frame) -> Frame {
    let group = |h: &Headers| -> Headers {
        let mut names: Vec<&str> = Vec::new();
        for (n, _) in h {
            if !names.contains(&n.as_str()) {
                names.push(n);
            }
        }
        names
            .iter()
            .flat_map(|name| {
                h.iter()
                    .filter(move |(n, _)| n == name)
                    .map(|(n, v)| (n.to_ascii_lowercase(), v.clone()))
            })
            .collect()
    };
    match f {
        Frame::SynStream { id, fin, headers } => Frame::SynStream {
            id: *id,
            fin: *fin,
            headers: group(headers),
        },
        Frame::SynReply { id, fin, headers } => Frame::SynReply {
            id: *id,
            fin: *fin,
            headers: group(headers),
        },
        Frame::Headers { id, fin, headers } => Frame::Headers {
            id: *id,
            fin: *fin,
            headers: group(headers),
        },
        other => other.clone(),
    }
}

/// The preset dictionary of SPDY/3's header compression (from the protocol's draft 3).
#[rustfmt::skip]
const DICTIONARY: &[u8] = b"\
\x00\x00\x00\x07options\x00\x00\x00\x04head\x00\x00\x00\x04post\x00\x00\x00\x03put\x00\x00\
\x00\x06delete\x00\x00\x00\x05trace\x00\x00\x00\x06accept\x00\x00\x00\x0eaccept-charset\x00\
\x00\x00\x0faccept-encoding\x00\x00\x00\x0faccept-language\x00\x00\x00\x0daccept-ranges\x00\
\x00\x00\x03age\x00\x00\x00\x05allow\x00\x00\x00\x0dauthorization\x00\x00\x00\x0dcache-contr\
ol\x00\x00\x00\x0aconnection\x00\x00\x00\x0ccontent-base\x00\x00\x00\x10content-encoding\x00\
\x00\x00\x10content-language\x00\x00\x00\x0econtent-length\x00\x00\x00\x10content-location\
\x00\x00\x00\x0bcontent-md5\x00\x00\x00\x0dcontent-range\x00\x00\x00\x0ccontent-type\x00\x00\
\x00\x04date\x00\x00\x00\x04etag\x00\x00\x00\x06expect\x00\x00\x00\x07expires\x00\x00\x00\
\x04from\x00\x00\x00\x04host\x00\x00\x00\x08if-match\x00\x00\x00\x11if-modified-since\x00\
\x00\x00\x0dif-none-match\x00\x00\x00\x08if-range\x00\x00\x00\x13if-unmodified-since\x00\x00\
\x00\x0dlast-modified\x00\x00\x00\x08location\x00\x00\x00\x0cmax-forwards\x00\x00\x00\x06pra\
gma\x00\x00\x00\x12proxy-authenticate\x00\x00\x00\x13proxy-authorization\x00\x00\x00\x05rang\
e\x00\x00\x00\x07referer\x00\x00\x00\x0bretry-after\x00\x00\x00\x06server\x00\x00\x00\x02te\
\x00\x00\x00\x07trailer\x00\x00\x00\x11transfer-encoding\x00\x00\x00\x07upgrade\x00\x00\x00\
\x0auser-agent\x00\x00\x00\x04vary\x00\x00\x00\x03via\x00\x00\x00\x07warning\x00\x00\x00\x10\
www-authenticate\x00\x00\x00\x06method\x00\x00\x00\x03get\x00\x00\x00\x06status\x00\x00\x00\
\x06200 OK\x00\x00\x00\x07version\x00\x00\x00\x08HTTP/1.1\x00\x00\x00\x03url\x00\x00\x00\x06\
public\x00\x00\x00\x0aset-cookie\x00\x00\x00\x0akeep-alive\x00\x00\x00\x06origin100101201202\
205206300302303304305306307402405406407408409410411412413414415416417502504505203 Non-Author\
itative Information204 No Content301 Moved Permanently400 Bad Request401 Unauthorized403 For\
bidden404 Not Found500 Internal Server Error501 Not Implemented503 Service UnavailableJan Fe\
b Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMTch\
unked,text/html,image/png,image/jpg,image/gif,application/xml,application/xhtml+xml,text/pla\
in,text/javascript,publicprivatemax-age=gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf\
-,*,enq=0.";

#[cfg(test)]
mod tests {
    use super::*;

    fn h(pairs: &[(&str, &str)]) -> Headers {
        pairs
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect()
    }

    /// A SYN_STREAM frame around a compressed header block.
    fn syn_stream(id: u32, block: &[u8]) -> Vec<u8> {
        let mut p = id.to_be_bytes().to_vec();
        p.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
        p.extend_from_slice(block);
        Encoder::control(SYN_STREAM, 0, &p)
    }

    #[test]
    fn checksums_and_the_zlib_header_are_zlibs() {
        assert_eq!(adler32(b"Wikipedia"), 0x11e6_0398);
        assert_eq!(DICTIONARY.len(), 1423);
        assert_eq!(adler32(DICTIONARY), 0xe3c6_a7c2);
        assert_eq!((u16::from(ZLIB_CMF) << 8 | u16::from(ZLIB_FLG)) % 31, 0);
    }

    #[test]
    fn header_blocks_compressed_by_zlib_with_the_dictionary_are_read() {
        // Two blocks from zlib (level 9, SPDY's dictionary, a sync flush after each), as Go's
        // framer writes them: the second is 14 bytes, mostly references into the first.
        let first: &[u8] = b"\x78\xf9\xe3\xc6\xa7\xc2\x02\x25\x3a\x70\x3a\x2b\x29\x4a\x4d\xcc\x85\x16\x25\xac\xa9\xa0\x80\x86\x14\xcb\x45\xa0\x24\xcc\x64\x61\x00\x24\x39\x8b\x20\x91\x98\x09\x4a\xdc\x8c\x06\x00\x00\x00\x00\xff\xff";
        let second: &[u8] = b"\xc2\xaa\x15\x54\x0a\x25\x12\xd2\x09\x00\x00\x00\xff\xff";
        let mut d = Decoder::default();
        d.push(&syn_stream(1, first));
        d.push(&syn_stream(3, second));
        assert_eq!(
            d.next_frame().unwrap(),
            Some(Frame::SynStream {
                id: 1,
                fin: false,
                headers: h(&[("streamtype", "error"), ("port", "80"), ("requestid", "0")]),
            })
        );
        assert_eq!(
            d.next_frame().unwrap(),
            Some(Frame::SynStream {
                id: 3,
                fin: false,
                headers: h(&[("streamtype", "data"), ("port", "80"), ("requestid", "0")]),
            })
        );
        assert_eq!(d.next_frame().unwrap(), None);
    }

    #[test]
    fn every_frame_written_reads_back_even_a_byte_at_a_time() {
        let frames = vec![
            Frame::SynStream {
                id: 1,
                fin: false,
                headers: h(&[("streamtype", "error"), ("port", "8080")]),
            },
            Frame::SynReply {
                id: 1,
                fin: true,
                headers: vec![],
            },
            Frame::Headers {
                id: 1,
                fin: false,
                headers: h(&[("x", "a"), ("x", "b")]),
            },
            Frame::Data {
                id: 3,
                fin: false,
                data: b"hello".to_vec(),
            },
            Frame::Data {
                id: 3,
                fin: true,
                data: vec![],
            },
            Frame::RstStream {
                id: 5,
                status: REFUSED_STREAM,
            },
            Frame::Ping(7),
            Frame::GoAway {
                last: 5,
                status: GOAWAY_PROTOCOL_ERROR,
            },
            Frame::Data {
                id: 9,
                fin: true,
                data: vec![7; 70_000],
            },
        ];
        let mut e = Encoder::default();
        let bytes: Vec<u8> = frames.iter().flat_map(|f| e.encode(f)).collect();
        let mut d = Decoder::default();
        let mut read = Vec::new();
        for b in &bytes {
            d.push(std::slice::from_ref(b));
            while let Some(f) = d.next_frame().unwrap() {
                read.push(f);
            }
        }
        assert_eq!(read, frames);
    }

    #[test]
    fn bad_input_is_an_error_not_a_panic() {
        // Another version.
        let mut d = Decoder::default();
        let mut f = Encoder::control(PING, 0, &1u32.to_be_bytes());
        f[1] = 2;
        d.push(&f);
        assert_eq!(d.next_frame(), Err(SpdyError::Version(2)));
        // Not zlib; zlib with another dictionary; corrupt deflate data.
        for (block, want) in [
            (&b"\x00\x00garbage"[..], "not a zlib stream"),
            (
                &b"\x78\x20\x00\x00\x00\x01"[..],
                "compressed with another dictionary",
            ),
            (&b"\x78\x9c\xff\xff\xff\xff"[..], "corrupt compressed data"),
        ] {
            let mut d = Decoder::default();
            d.push(&syn_stream(1, block));
            assert_eq!(d.next_frame(), Err(SpdyError::Headers(want)), "{block:?}");
        }
        // A block claiming more headers than it holds, and a short control frame.
        let mut e = Encoder::default();
        let mut d = Decoder::default();
        let mut p = 1u32.to_be_bytes().to_vec();
        p.extend(e.compress(&[0, 0, 1, 0, 0, 0, 0, 1]));
        d.push(&Encoder::control(SYN_REPLY, 0, &p));
        assert_eq!(
            d.next_frame(),
            Err(SpdyError::Headers("more headers than bytes"))
        );
        let mut d = Decoder::default();
        d.push(&Encoder::control(SYN_STREAM, 0, &[0, 0, 0, 1]));
        assert_eq!(d.next_frame(), Err(SpdyError::Malformed("SYN_STREAM")));
        // A frame still coming is not an error.
        let mut d = Decoder::default();
        d.push(&[0, 0, 0, 1, 0, 0, 0, 9, 1, 2]);
        assert_eq!(d.next_frame(), Ok(None));
    }
}
