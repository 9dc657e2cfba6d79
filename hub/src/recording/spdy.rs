//! Reading an exec session's SPDY/3.1 bytes as they pass (client-go's SPDY executor, which
//! kubectl before 1.31 speaks): the client opens one stream a channel, named by its
//! `streamType` header, and each data frame is that channel's bytes. What is read here comes
//! out as the messages a WebSocket session carries (a channel byte, then the bytes), so one
//! [`super::cast::Cast`] records both. Nothing here writes to the connection.

use std::collections::HashMap;

use kubeshape::spdy::{Frame, Session};

/// The most either side's unread bytes may hold: SPDY frames are at most 16 MiB, and an
/// exec's far smaller; past that the stream is not what it seemed and is not followed.
const MAX_BUFFERED: usize = 17 * 1024 * 1024;

/// Both directions of one session.
#[derive(Debug, Default)]
pub struct Reader {
    /// Each side's header compression (a connection has one per direction).
    client: Session,
    server: Session,
    client_bytes: Vec<u8>,
    server_bytes: Vec<u8>,
    /// The channel of each stream the client opened.
    channels: HashMap<u32, u8>,
    /// Set once the bytes are not SPDY as this reader knows it: nothing more is read.
    lost: bool,
}

impl Reader {
    /// Adds bytes one side sent and returns the channel messages they complete.
    pub fn feed(&mut self, from_client: bool, bytes: &[u8]) -> Vec<Vec<u8>> {
        if self.lost {
            return Vec::new();
        }
        let (session, input) = if from_client {
            (&mut self.client, &mut self.client_bytes)
        } else {
            (&mut self.server, &mut self.server_bytes)
        };
        input.extend_from_slice(bytes);
        let mut messages = Vec::new();
        loop {
            let frame = match session.next_frame(input) {
                Ok(Some(frame)) => frame,
                Ok(None) => break,
                Err(e) => {
                    tracing::debug!(error = %e, "a recorded session's SPDY is not readable; the rest is not recorded");
                    self.lost = true;
                    break;
                }
            };
            match frame {
                Frame::SynStream {
                    stream, headers, ..
                } if from_client => {
                    if let Some(channel) = kubeshape::spdy::exec_channel(&headers) {
                        self.channels.insert(stream, channel);
                    }
                }
                Frame::Data { stream, data, .. } if !data.is_empty() => {
                    let Some(&channel) = self.channels.get(&stream) else {
                        continue;
                    };
                    messages.extend(kubeshape::spdy::channel_messages(channel, &data));
                }
                _ => {}
            }
        }
        if input.len() > MAX_BUFFERED {
            self.lost = true;
            input.clear();
        }
        messages
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubeshape::spdy;

    #[test]
    fn streams_become_channel_messages_both_ways() {
        let mut client = Session::new();
        let mut reader = Reader::default();
        let mut opened = Vec::new();
        for (stream, kind) in [(1, "error"), (3, "stdin"), (5, "stdout"), (7, "resize")] {
            opened.extend(client.syn_stream(stream, &[("streamtype", kind)]).unwrap());
        }
        // Cut anywhere: a frame is read once it is whole.
        let (a, b) = opened.split_at(17);
        assert!(reader.feed(true, a).is_empty());
        assert!(reader.feed(true, b).is_empty());
        let mut typed = spdy::data(3, b"ls\n", false);
        typed.extend(spdy::data(
            7,
            b"{\"Width\":100,\"Height\":30}\n{\"Width\":90,\"Height\":20}\n",
            false,
        ));
        assert_eq!(
            reader.feed(true, &typed),
            vec![
                b"\x00ls\n".to_vec(),
                b"\x04{\"Width\":100,\"Height\":30}".to_vec(),
                b"\x04{\"Width\":90,\"Height\":20}".to_vec(),
            ]
        );
        let mut server = Session::new();
        let mut written = server.syn_reply(1).unwrap();
        written.extend(spdy::data(5, b"file\n", false));
        written.extend(spdy::data(5, b"", true));
        written.extend(spdy::data(1, b"{\"status\":\"Success\"}", true));
        assert_eq!(
            reader.feed(false, &written),
            vec![
                b"\x01file\n".to_vec(),
                b"\x03{\"status\":\"Success\"}".to_vec()
            ]
        );
        // A stream the client never named is not recorded.
        assert!(reader.feed(false, &spdy::data(9, b"?", false)).is_empty());
    }

    #[test]
    fn bytes_that_are_not_spdy_stop_the_reading() {
        let mut reader = Reader::default();
        // A control frame of version 2.
        assert!(
            reader
                .feed(true, &[0x80, 0x02, 0, 1, 0, 0, 0, 0])
                .is_empty()
        );
        let mut client = Session::new();
        let opened = client.syn_stream(1, &[("streamtype", "stdout")]).unwrap();
        assert!(reader.feed(true, &opened).is_empty());
        assert!(reader.feed(false, &spdy::data(1, b"x", false)).is_empty());
    }
}
