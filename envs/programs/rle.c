/* Run-length encoding and decoding of a byte buffer, checked by a round trip. */
static int rle_encode(const unsigned char *in, int n, unsigned char *out) {
    int o = 0;
    for (int i = 0; i < n;) {
        int run = 1;
        while (i + run < n && in[i + run] == in[i] && run < 255)
            run++;
        out[o++] = (unsigned char)run;
        out[o++] = in[i];
        i += run;
    }
    return o;
}

static int rle_decode(const unsigned char *in, int n, unsigned char *out) {
    int o = 0;
    for (int i = 0; i + 1 < n; i += 2)
        for (int k = 0; k < in[i]; k++)
            out[o++] = in[i + 1];
    return o;
}

int main(void) {
    unsigned char data[300], packed[600], unpacked[300];
    for (int i = 0; i < 300; i++)
        data[i] = (unsigned char)(i / 13 % 5);
    int packed_len = rle_encode(data, 300, packed);
    int unpacked_len = rle_decode(packed, packed_len, unpacked);
    int same = unpacked_len == 300;
    for (int i = 0; same && i < 300; i++)
        same = unpacked[i] == data[i];
    return same ? packed_len : -1;
}
