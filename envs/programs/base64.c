/* Base64 encoding and decoding of a short message, checked by a round trip. */
static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static int encode(const unsigned char *in, int n, char *out) {
    int o = 0;
    for (int i = 0; i < n; i += 3) {
        unsigned int v = (unsigned int)in[i] << 16;
        if (i + 1 < n) v |= (unsigned int)in[i + 1] << 8;
        if (i + 2 < n) v |= in[i + 2];
        out[o++] = alphabet[(v >> 18) & 63u];
        out[o++] = alphabet[(v >> 12) & 63u];
        out[o++] = i + 1 < n ? alphabet[(v >> 6) & 63u] : '=';
        out[o++] = i + 2 < n ? alphabet[v & 63u] : '=';
    }
    out[o] = 0;
    return o;
}

static int value_of(char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    return c == '+' ? 62 : c == '/' ? 63 : -1;
}

static int decode(const char *in, int n, unsigned char *out) {
    int o = 0;
    for (int i = 0; i + 3 < n; i += 4) {
        unsigned int v = 0;
        int pad = 0;
        for (int k = 0; k < 4; k++) {
            int d = value_of(in[i + k]);
            if (d < 0) {
                d = 0;
                pad++;
            }
            v = (v << 6) | (unsigned int)d;
        }
        out[o++] = (unsigned char)(v >> 16);
        if (pad < 2) out[o++] = (unsigned char)(v >> 8);
        if (pad < 1) out[o++] = (unsigned char)v;
    }
    return o;
}

int main(void) {
    const unsigned char msg[] = "pass ordering beats the default pipeline";
    char text[64];
    unsigned char back[64];
    int n = (int)sizeof(msg) - 1;
    int len = encode(msg, n, text);
    int m = decode(text, len, back);
    int same = m == n;
    for (int i = 0; same && i < n; i++)
        same = back[i] == msg[i];
    return same ? len : -1;
}
