/* fuzz_wire.c: libFuzzer target over what a worker reads from the network: the
 * handshake, before it trusts a byte (auth.c), and the frames and text payloads of
 * the coordinator's links after it (wire.c). Whatever the bytes, each must be refused
 * or read within its buffers, with no hang; and no bytes may pass a handshake, since
 * its proofs answer a fresh random nonce under a key the sender does not have.
 *
 * An input is a role byte, then the bytes the other side sends (then it closes):
 *   0 they connect: this side accepts (ddp_auth_accept);
 *   1 they accept: this side connects (ddp_auth_connect);
 *   2 frames as the coordinator reads them (ddp_reader_feed), each frame's text then
 *     searched for the keys a rendezvous reads (ddp_text_field, ddp_text_number). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "runtime.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { ROLE_ACCEPT, ROLE_CONNECT, ROLE_FRAMES, ROLES };

/* The other side's bytes, all sent before this side reads, then its end closed for
 * writing: a socket pair's buffer holds far more than an input's 8 KiB. */
static void other_side_says(int fd, const uint8_t *data, size_t size) {
    if (size && send(fd, data, size, 0) != (ssize_t)size) {
        perror("fuzz_wire: send");
        abort();
    }
    shutdown(fd, SHUT_WR);
}

static void handshake(int role, int fd) {
    static const unsigned char key[32] = "a key the input cannot know....";
    ddp_auth a;
    ddp_auth_with_key(&a, key, "fuzz");
    char err[512];
    double deadline = ddp_now_ms() + 200;
    bool passed = role == ROLE_ACCEPT ? ddp_auth_accept(&a, fd, deadline, err, sizeof err)
                                      : ddp_auth_connect(&a, fd, deadline, err, sizeof err);
    if (passed) {
        fprintf(stderr, "fuzz_wire: bytes without the key passed the handshake\n");
        abort();
    }
}

static void frames(int fd) {
    ddp_reader reader = {0};
    ddp_frame f;
    const char *problem;
    while (ddp_reader_feed(&reader, fd, 1 << 16, &f, &problem) == 1) {
        char value[256];
        int64_t n;
        ddp_text_field(f.data, "address", value, sizeof value);
        ddp_text_field(f.data, "setting program", value, sizeof value);
        ddp_text_number(f.data, "rank", &n);
        ddp_text_number(f.data, "port", &n);
        ddp_frame_free(&f);
    }
    ddp_reader_free(&reader);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || data[0] >= ROLES)
        return 0;
    int pair[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, pair) != 0) {
        perror("fuzz_wire: socketpair");
        abort();
    }
    other_side_says(pair[1], data + 1, size - 1);
    if (data[0] == ROLE_FRAMES)
        frames(pair[0]);
    else
        handshake(data[0], pair[0]);
    close(pair[0]);
    close(pair[1]);
    return 0;
}
