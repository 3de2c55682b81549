/* Bitwise CRC-32 (reflected, polynomial 0xEDB88320) of a generated buffer, and a table-driven one. */
static unsigned int crc_table[256];

static void make_table(void) {
    for (unsigned int n = 0; n < 256; n++) {
        unsigned int c = n;
        for (int k = 0; k < 8; k++)
            c = (c & 1u) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[n] = c;
    }
}

static unsigned int crc_bitwise(const unsigned char *buf, int len) {
    unsigned int crc = 0xFFFFFFFFu;
    for (int i = 0; i < len; i++) {
        crc ^= buf[i];
        for (int k = 0; k < 8; k++)
            crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
    }
    return ~crc;
}

static unsigned int crc_table_driven(const unsigned char *buf, int len) {
    unsigned int crc = 0xFFFFFFFFu;
    for (int i = 0; i < len; i++)
        crc = crc_table[(crc ^ buf[i]) & 0xFFu] ^ (crc >> 8);
    return ~crc;
}

int main(void) {
    unsigned char data[200];
    for (int i = 0; i < 200; i++)
        data[i] = (unsigned char)(i * 37 + 11);
    make_table();
    return crc_bitwise(data, 200) == crc_table_driven(data, 200) ? 0 : 1;
}
