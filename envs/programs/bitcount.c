/* Bit manipulation: three population counts, bit reversal and the parity of a word. */
static int popcount_loop(unsigned int x) {
    int n = 0;
    while (x) {
        n += x & 1u;
        x >>= 1;
    }
    return n;
}

static int popcount_kernighan(unsigned int x) {
    int n = 0;
    for (; x; n++)
        x &= x - 1;
    return n;
}

static int popcount_swar(unsigned int x) {
    x = x - ((x >> 1) & 0x55555555u);
    x = (x & 0x33333333u) + ((x >> 2) & 0x33333333u);
    x = (x + (x >> 4)) & 0x0F0F0F0Fu;
    return (int)((x * 0x01010101u) >> 24);
}

static unsigned int reverse_bits(unsigned int x) {
    unsigned int r = 0;
    for (int i = 0; i < 32; i++) {
        r = (r << 1) | (x & 1u);
        x >>= 1;
    }
    return r;
}

static int parity(unsigned int x) {
    x ^= x >> 16;
    x ^= x >> 8;
    x ^= x >> 4;
    return (int)((0x6996u >> (x & 0xFu)) & 1u);
}

int main(void) {
    int agree = 0;
    for (unsigned int x = 1; x < 5000; x += 37) {
        int a = popcount_loop(x), b = popcount_kernighan(x), c = popcount_swar(x);
        agree += (a == b && b == c) + parity(reverse_bits(x));
    }
    return agree & 0xFF;
}
