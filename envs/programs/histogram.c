/* Byte histogram of a buffer, its most frequent byte and a cumulative distribution. */
static unsigned int hist[256];
static unsigned int cumulative[256];

static void count_bytes(const unsigned char *buf, int len) {
    for (int i = 0; i < 256; i++)
        hist[i] = 0;
    for (int i = 0; i < len; i++)
        hist[buf[i]]++;
}

static int most_frequent(void) {
    int best = 0;
    for (int i = 1; i < 256; i++)
        if (hist[i] > hist[best])
            best = i;
    return best;
}

static void accumulate(void) {
    unsigned int running = 0;
    for (int i = 0; i < 256; i++) {
        running += hist[i];
        cumulative[i] = running;
    }
}

int main(void) {
    unsigned char buf[512];
    for (int i = 0; i < 512; i++)
        buf[i] = (unsigned char)((i * i + 3 * i) % 97);
    count_bytes(buf, 512);
    accumulate();
    return most_frequent() + (int)(cumulative[255] & 0xF);
}
