/* A fixed-size ring buffer (queue) driving a moving average over a stream of samples. */
#define CAP 16

struct ring {
    int data[CAP];
    int head, count;
};

static void ring_push(struct ring *r, int v) {
    r->data[(r->head + r->count) % CAP] = v;
    if (r->count < CAP)
        r->count++;
    else
        r->head = (r->head + 1) % CAP;
}

static int ring_mean(const struct ring *r) {
    int s = 0;
    for (int i = 0; i < r->count; i++)
        s += r->data[(r->head + i) % CAP];
    return r->count ? s / r->count : 0;
}

static int ring_max(const struct ring *r) {
    int m = r->data[r->head];
    for (int i = 1; i < r->count; i++) {
        int v = r->data[(r->head + i) % CAP];
        if (v > m)
            m = v;
    }
    return m;
}

int main(void) {
    struct ring r = {{0}, 0, 0};
    int total = 0;
    for (int t = 0; t < 200; t++) {
        ring_push(&r, (t * 13) % 50 - 10);
        total += ring_mean(&r) + ring_max(&r);
    }
    return total & 0xFF;
}
